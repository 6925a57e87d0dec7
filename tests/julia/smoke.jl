# Smoke test of the fmha C ABI from Julia through `ccall`: the same checks as tests/go
# (version, an error message, a device round trip).
#
#   FMHA_LIB=PREFIX/lib/libfmha.so julia tests/julia/smoke.jl
#
# PREFIX is an installation made by scripts/install.sh. Without FMHA_LIB the library is looked up
# as "libfmha" on the dynamic loader's path (LD_LIBRARY_PATH). Julia is not installable on the CI
# machines (Debian 12 has no package), so CI does not run this script; it is shipped for users.
#
# fmha keeps the last error message per OS thread. `ccall` does not yield, so reading the message
# right after the failing call, with no other call in between, reads that call's message.

using Test

const libfmha = get(ENV, "FMHA_LIB", "libfmha")

# Status codes and constants (values are ABI; see include/fmha.h).
const FMHA_OK = Int32(0)
const FMHA_ERR_INVALID_ARGUMENT = Int32(1)
const FMHA_ERR_NO_DEVICE = Int32(7)
const FMHA_ERR_NULL_POINTER = Int32(8)
const FMHA_BACKEND_HOST = Int32(0)
const FMHA_MEMCPY_HOST_TO_DEVICE = Int32(1)
const FMHA_MEMCPY_DEVICE_TO_HOST = Int32(2)
const FMHA_MEMCPY_DEVICE_TO_DEVICE = Int32(3)

fmha_version() = unsafe_string(ccall((:fmha_version, libfmha), Cstring, ()))
fmha_version_number() = ccall((:fmha_version_number, libfmha), UInt32, ())
fmha_backend() = ccall((:fmha_backend, libfmha), Int32, ())
fmha_status_string(status) = unsafe_string(ccall((:fmha_status_string, libfmha), Cstring, (Int32,), status))

"The calling thread's last error message."
function last_error_message()
    n = ccall((:fmha_last_error_message, libfmha), Csize_t, (Ptr{UInt8}, Csize_t), C_NULL, 0)
    buffer = Vector{UInt8}(undef, n + 1)
    ccall((:fmha_last_error_message, libfmha), Csize_t, (Ptr{UInt8}, Csize_t), buffer, length(buffer))
    return String(buffer[1:n])
end

"Throws with the status and the library's message unless `status` is FMHA_OK."
function check(status::Int32, what::AbstractString)
    status == FMHA_OK && return nothing
    message = last_error_message()
    error("$what failed: $(fmha_status_string(status)) ($status): $message")
end

function device_malloc(bytes::Integer)
    p = Ref{Ptr{Cvoid}}(C_NULL)
    check(ccall((:fmha_device_malloc, libfmha), Int32, (Ptr{Ptr{Cvoid}}, Csize_t), p, bytes), "fmha_device_malloc")
    return p[]
end
device_free(p) = check(ccall((:fmha_device_free, libfmha), Int32, (Ptr{Cvoid},), p), "fmha_device_free")

function host_malloc_pinned(bytes::Integer)
    p = Ref{Ptr{Cvoid}}(C_NULL)
    check(ccall((:fmha_host_malloc_pinned, libfmha), Int32, (Ptr{Ptr{Cvoid}}, Csize_t), p, bytes),
          "fmha_host_malloc_pinned")
    return p[]
end
host_free_pinned(p) = check(ccall((:fmha_host_free_pinned, libfmha), Int32, (Ptr{Cvoid},), p), "fmha_host_free_pinned")

function stream_create()
    s = Ref{Ptr{Cvoid}}(C_NULL)
    check(ccall((:fmha_stream_create, libfmha), Int32, (Ptr{Ptr{Cvoid}},), s), "fmha_stream_create")
    return s[]
end
stream_destroy(s) = check(ccall((:fmha_stream_destroy, libfmha), Int32, (Ptr{Cvoid},), s), "fmha_stream_destroy")
stream_synchronize(s) =
    check(ccall((:fmha_stream_synchronize, libfmha), Int32, (Ptr{Cvoid},), s), "fmha_stream_synchronize")

memcpy_async(dst, src, bytes, kind, stream) = check(
    ccall((:fmha_memcpy_async, libfmha), Int32, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t, Int32, Ptr{Cvoid}),
          dst, src, bytes, kind, stream),
    "fmha_memcpy_async")
memcpy_status(dst, src, bytes, kind) =
    ccall((:fmha_memcpy, libfmha), Int32, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t, Int32), dst, src, bytes, kind)

"The CU count, or `nothing` on a GPU build without a device."
function device_cu_count()
    n = Ref{Int32}(0)
    status = ccall((:fmha_device_cu_count, libfmha), Int32, (Ptr{Int32},), n)
    if status == FMHA_ERR_NO_DEVICE && fmha_backend() != FMHA_BACKEND_HOST
        message = last_error_message()
        @info "no device: $message"
        return nothing
    end
    check(status, "fmha_device_cu_count")
    return Int(n[])
end

@testset "fmha smoke test" begin
    @testset "version" begin
        v = fmha_version()
        @test occursin(r"^\d+\.\d+\.\d+", v)
        parts = parse.(Int, split(match(r"^(\d+)\.(\d+)\.(\d+)", v).match, '.'))
        @test fmha_version_number() == parts[1] * 10000 + parts[2] * 100 + parts[3]
        @test fmha_backend() in (Int32(0), Int32(1), Int32(2))
        @test fmha_status_string(FMHA_OK) == "success"
        @test fmha_status_string(Int32(12345)) == "unknown status"
        println("fmha $v, backend $(fmha_backend())")
    end

    @testset "error message" begin
        status = ccall((:fmha_device_malloc, libfmha), Int32, (Ptr{Ptr{Cvoid}}, Csize_t), C_NULL, 64)
        message = last_error_message()
        @test status == FMHA_ERR_NULL_POINTER
        @test occursin("ptr", message)
        # Truncation: at most length - 1 bytes plus a NUL; the return value is the full length.
        small = fill(UInt8('X'), 8)
        n = ccall((:fmha_last_error_message, libfmha), Csize_t, (Ptr{UInt8}, Csize_t), small, 5)
        @test n == sizeof(message)
        @test small[5] == 0x00 && small[6] == UInt8('X')
        if fmha_backend() == FMHA_BACKEND_HOST
            bogus = zeros(UInt8, 16)
            status = ccall((:fmha_device_free, libfmha), Int32, (Ptr{Cvoid},), bogus)
            message = last_error_message()
            @test status == FMHA_ERR_INVALID_ARGUMENT
            @test occursin("ptr", message)
        end
    end

    @testset "device round trip" begin
        cus = device_cu_count()
        if cus === nothing
            @test_skip "device round trip (no device)"
        else
            @test cus > 0
            n = 1 << 20
            pin_in = host_malloc_pinned(n)
            pin_out = host_malloc_pinned(n)
            a = device_malloc(n)
            b = device_malloc(n)
            s = stream_create()
            input = unsafe_wrap(Array, Ptr{UInt8}(pin_in), n)
            output = unsafe_wrap(Array, Ptr{UInt8}(pin_out), n)
            for i in 1:n
                input[i] = (i * 7 + (i >> 8)) % UInt8
            end
            fill!(output, 0x00)
            memcpy_async(a, pin_in, n, FMHA_MEMCPY_HOST_TO_DEVICE, s)
            memcpy_async(b, a, n, FMHA_MEMCPY_DEVICE_TO_DEVICE, s)
            memcpy_async(pin_out, b, n, FMHA_MEMCPY_DEVICE_TO_HOST, s)
            stream_synchronize(s)
            @test output == input

            status = memcpy_status(a, b, n, Int32(42))
            message = last_error_message()
            @test status == FMHA_ERR_INVALID_ARGUMENT
            @test occursin("kind", message)

            stream_destroy(s)
            device_free(a)
            device_free(b)
            host_free_pinned(pin_in)
            host_free_pinned(pin_out)
        end
    end
end
