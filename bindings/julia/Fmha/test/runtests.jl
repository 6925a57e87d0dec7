# The smoke test of Fmha.jl: version, error messages, a device round trip, and a forward against a
# Float64 reference. Not run by CI: see ../README.md.
#
#   FMHA_LIB=PREFIX/lib/libfmha.so julia --project=bindings/julia/Fmha -e 'using Pkg; Pkg.test()'

using Fmha
using Test

const F = Fmha

offset_of(T, field) = fieldoffset(T, Base.fieldindex(T, field))

"The CU count, or `nothing` on a GPU build without a device."
function device_cu_count()
    n = Ref{Int32}(0)
    status = ccall((:fmha_device_cu_count, F.libfmha), Int32, (Ptr{Int32},), n)
    if status == F.ERR_NO_DEVICE && F.backend() != F.BACKEND_HOST
        @info "no device: $(F.last_error_message())"
        return nothing
    end
    F.check(status, :fmha_device_cu_count)
    return Int(n[])
end

"Float64 attention of one batch-mode problem in [batch][seq][head][dim] layout: O and the LSE [batch][head][seq]."
function reference_forward(q, k, v; batch, seq, hq, hk, dim, causal)
    at(b, s, heads, h, c) = ((b * seq + s) * heads + h) * dim + c + 1
    o = zeros(Float64, batch * seq * hq * dim)
    lse = zeros(Float64, batch * hq * seq)
    scale = 1 / sqrt(dim)
    for b in 0:batch-1, h in 0:hq-1, i in 0:seq-1
        kv = h ÷ (hq ÷ hk)
        scores = [causal && j > i ? -Inf :
                  scale * sum(Float64(q[at(b, i, hq, h, c)]) * Float64(k[at(b, j, hk, kv, c)]) for c in 0:dim-1)
                  for j in 0:seq-1]
        m = maximum(scores)
        p = exp.(scores .- m)
        lse[(b * hq + h) * seq + i + 1] = m + log(sum(p))
        p ./= sum(p)
        for c in 0:dim-1
            o[at(b, i, hq, h, c)] = sum(p[j+1] * Float64(v[at(b, j, hk, kv, c)]) for j in 0:seq-1)
        end
    end
    return o, lse
end

@testset "Fmha" begin
    @testset "struct layouts match include/fmha.h" begin
        # Sizes and offsets printed by a C program compiled against include/fmha.h (x86-64, aarch64).
        @test sizeof(F.CTensor) == 32
        @test sizeof(F.CScale) == 32
        @test sizeof(F.FwdTraits) == 40
        @test offset_of(F.FwdTraits, :o_dtype) == 36
        @test sizeof(F.FwdArgs) == 336
        @test offset_of(F.FwdArgs, :q) == 8
        @test offset_of(F.FwdArgs, :seqstart_q) == 168
        @test offset_of(F.FwdArgs, :batch) == 200
        @test offset_of(F.FwdArgs, :scale) == 228
        @test offset_of(F.FwdArgs, :window_size_left) == 232
        @test offset_of(F.FwdArgs, :q_descale) == 240
    end

    @testset "version" begin
        v = F.version()
        parts = parse.(Int, split(match(r"^(\d+)\.(\d+)\.(\d+)", v).match, '.'))
        @test F.version_number() == parts[1] * 10000 + parts[2] * 100 + parts[3]
        @test F.backend() in (F.BACKEND_HOST, F.BACKEND_CUDA, F.BACKEND_ROCM)
        @test F.status_string(F.OK) == "success"
        @test F.status_string(12345) == "unknown status"
        println("fmha $v, backend $(F.backend())")
    end

    @testset "error message" begin
        status = ccall((:fmha_device_malloc, F.libfmha), Int32, (Ptr{Ptr{Cvoid}}, Csize_t), C_NULL, 64)
        message = F.last_error_message()
        @test status == F.ERR_NULL_POINTER
        @test occursin("ptr", message)
        # Truncation: at most length - 1 bytes plus a NUL; the return value is the full length.
        small = fill(UInt8('X'), 8)
        n = ccall((:fmha_last_error_message, F.libfmha), Csize_t, (Ptr{UInt8}, Csize_t), small, 5)
        @test n == sizeof(message)
        @test small[5] == 0x00 && small[6] == UInt8('X')
        # Through check: an FmhaError with the status and the message.
        err = try
            F.check(status, :fmha_device_malloc)
        catch e
            e
        end
        @test err isa FmhaError && err.status == F.ERR_NULL_POINTER && occursin("ptr", err.message)
        @test occursin("fmha_device_malloc", sprint(showerror, err))
    end

    cus = device_cu_count()
    if cus === nothing
        @test_skip "device tests (no device)"
    else
        @testset "device round trip" begin
            @test cus > 0
            n = 1 << 16
            input = [UInt8((i * 7 + (i >> 8)) % 256) for i in 1:n]
            a = DeviceBuffer{UInt8}(n)
            upload!(a, input)
            output = zeros(UInt8, n)
            download!(output, a)
            @test output == input
            status = ccall((:fmha_memcpy, F.libfmha), Int32, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t, Int32),
                           a.ptr, a.ptr, n, Int32(42))
            message = F.last_error_message()
            @test status == F.ERR_INVALID_ARGUMENT
            @test occursin("kind", message)
            close(a)
            close(a) # closing again does nothing
            @test_throws ArgumentError upload!(a, input)
            s = Stream()
            synchronize(s)
            close(s)
            close(s)
            @test_throws ArgumentError synchronize(s)
        end

        @testset "forward (fp16, GQA, causal)" begin
            batch, seq, hq, hk, dim = 2, 24, 4, 2, 64
            random(n) = Float16.(2 .* rand(n) .- 1)
            q, k, v = random(batch * seq * hq * dim), random(batch * seq * hk * dim), random(batch * seq * hk * dim)
            qb, kb, vb = DeviceBuffer{Float16}(length(q)), DeviceBuffer{Float16}(length(k)), DeviceBuffer{Float16}(length(v))
            ob, lseb = DeviceBuffer{Float16}(length(q)), DeviceBuffer{Float32}(batch * hq * seq)
            upload!(qb, q)
            upload!(kb, k)
            upload!(vb, v)
            upload!(ob, fill(NaN16, length(q)))           # poisoned: unwritten outputs show
            upload!(lseb, fill(NaN32, batch * hq * seq))
            stream = Stream()
            bshd(b, heads) = tensor(b, seq * heads * dim, dim, heads * dim)
            forward!(dtype = F.DTYPE_FP16, q = bshd(qb, hq), k = bshd(kb, hk), v = bshd(vb, hk), o = bshd(ob, hq),
                     lse = tensor(lseb, hq * seq, seq, 1), batch = batch, seqlen_q = seq, seqlen_k = seq,
                     nhead_q = hq, nhead_k = hk, hdim_q = dim, hdim_v = dim, mask_type = F.MASK_TOP_LEFT,
                     stream = stream)
            synchronize(stream)
            o, lse = download!(similar(q), ob), download!(zeros(Float32, batch * hq * seq), lseb)
            o_ref, lse_ref = reference_forward(q, k, v; batch, seq, hq, hk, dim, causal = true)
            # The C examples' tolerance: max error relative to the largest reference value (NaN fails).
            relative = maximum(abs.(Float64.(o) .- o_ref)) / maximum(abs.(o_ref))
            @test relative < 2e-2
            @test maximum(abs.(Float64.(lse) .- lse_ref)) < 1e-3

            # A bad field throws an FmhaError naming it.
            err = try
                forward!(dtype = F.DTYPE_FP16, q = bshd(qb, hq), k = bshd(kb, hk), v = bshd(vb, hk), o = bshd(ob, hq),
                         batch = batch, seqlen_q = seq, seqlen_k = seq, nhead_q = hq, nhead_k = hk, hdim_q = -3,
                         hdim_v = dim)
            catch e
                e
            end
            @test err isa FmhaError && err.status == F.ERR_INVALID_ARGUMENT && occursin("hdim_q", err.message)

            close(stream)
            foreach(close, (qb, kb, vb, ob, lseb))
        end
    end
end
