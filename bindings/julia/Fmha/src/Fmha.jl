"""
    Fmha

Julia binding of fmha's C ABI (`include/fmha.h`) through `ccall`: version and backend, errors as
[`FmhaError`](@ref), device buffers, streams and the attention forward in batch mode.

Never run: Julia is not available on the machines where it was written or on CI (see README.md).
"""
module Fmha

export FmhaError, DeviceBuffer, Stream, upload!, download!, tensor, forward!, synchronize

# Read at precompile time: re-precompile the package to point it at another library.
const libfmha = get(ENV, "FMHA_LIB", "libfmha")

# Values of the C ABI (include/fmha.h); they never change.
const OK = Int32(0)
const ERR_INVALID_ARGUMENT = Int32(1)
const ERR_UNSUPPORTED = Int32(2)
const ERR_NO_DEVICE = Int32(7)
const ERR_NULL_POINTER = Int32(8)
const BACKEND_HOST = Int32(0)
const BACKEND_CUDA = Int32(1)
const BACKEND_ROCM = Int32(2)
const DTYPE_FP16 = Int32(0)
const DTYPE_BF16 = Int32(1)
const MASK_NONE = Int32(0)
const MASK_TOP_LEFT = Int32(1)
const MASK_BOTTOM_RIGHT = Int32(2)
const MEMCPY_HOST_TO_DEVICE = Int32(1)
const MEMCPY_DEVICE_TO_HOST = Int32(2)
const MEMCPY_DEVICE_TO_DEVICE = Int32(3)

"The loaded library's version string, e.g. \"0.2.0\"."
version() = unsafe_string(ccall((:fmha_version, libfmha), Cstring, ()))
"The loaded library's `major * 10000 + minor * 100 + patch`."
version_number() = ccall((:fmha_version_number, libfmha), UInt32, ())
"`BACKEND_HOST`, `BACKEND_CUDA` or `BACKEND_ROCM`."
backend() = ccall((:fmha_backend, libfmha), Int32, ())
"The library's description of a status (\"unknown status\" for values that are not codes)."
status_string(status::Integer) = unsafe_string(ccall((:fmha_status_string, libfmha), Cstring, (Int32,), status))

# ---- errors -----------------------------------------------------------------------------------------

"A failed fmha call: the C function, its status and the library's message (which names the field)."
struct FmhaError <: Exception
    func::Symbol
    status::Int32
    message::String
end

Base.showerror(io::IO, e::FmhaError) =
    print(io, e.func, ": ", status_string(e.status), " (", e.status, "): ", e.message)

"The calling thread's last error message."
function last_error_message()
    n = ccall((:fmha_last_error_message, libfmha), Csize_t, (Ptr{UInt8}, Csize_t), C_NULL, 0)
    buffer = Vector{UInt8}(undef, n + 1)
    ccall((:fmha_last_error_message, libfmha), Csize_t, (Ptr{UInt8}, Csize_t), buffer, length(buffer))
    return String(buffer[1:n])
end

# fmha keeps the message per OS thread. A task moves to another thread only where it yields, and
# neither a `ccall` nor this function yields: called right after the failing `ccall`, it reads that
# call's message.
function check(status::Int32, func::Symbol)
    status == OK && return nothing
    throw(FmhaError(func, status, last_error_message()))
end

# ---- device memory and streams ----------------------------------------------------------------------

"""
    DeviceBuffer{T}(n)

Device memory for `n` elements of `T` (`fmha_device_malloc`). Free it with `close` (closing again
does nothing); no finalizer frees it, because queued device work may still use it.
"""
mutable struct DeviceBuffer{T}
    ptr::Ptr{T}
    length::Int
end

function DeviceBuffer{T}(n::Integer) where {T}
    isbitstype(T) || throw(ArgumentError("DeviceBuffer element type $T is not a bits type"))
    n >= 0 || throw(ArgumentError("DeviceBuffer length $n is negative"))
    p = Ref{Ptr{Cvoid}}(C_NULL)
    status = ccall((:fmha_device_malloc, libfmha), Int32, (Ptr{Ptr{Cvoid}}, Csize_t), p, n * sizeof(T))
    check(status, :fmha_device_malloc)
    return DeviceBuffer{T}(Ptr{T}(p[]), Int(n))
end

Base.length(b::DeviceBuffer) = b.length

function open_ptr(b::DeviceBuffer)
    b.ptr == C_NULL && throw(ArgumentError("the DeviceBuffer is closed"))
    return b.ptr
end

function Base.close(b::DeviceBuffer{T}) where {T}
    p = b.ptr
    p == C_NULL && return nothing
    b.ptr = Ptr{T}(C_NULL)
    check(ccall((:fmha_device_free, libfmha), Int32, (Ptr{Cvoid},), p), :fmha_device_free)
end

"Copies `host` to the start of `b` and waits."
function upload!(b::DeviceBuffer{T}, host::Vector{T}) where {T}
    length(host) <= length(b) || throw(ArgumentError("$(length(host)) elements do not fit in $(length(b))"))
    status = ccall((:fmha_memcpy, libfmha), Int32, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t, Int32),
                   open_ptr(b), host, sizeof(host), MEMCPY_HOST_TO_DEVICE)
    check(status, :fmha_memcpy)
    return b
end

"Copies the start of `b` into `host` and waits; synchronize the stream that wrote `b` first."
function download!(host::Vector{T}, b::DeviceBuffer{T}) where {T}
    length(host) <= length(b) || throw(ArgumentError("$(length(host)) elements are more than $(length(b))"))
    status = ccall((:fmha_memcpy, libfmha), Int32, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t, Int32),
                   host, open_ptr(b), sizeof(host), MEMCPY_DEVICE_TO_HOST)
    check(status, :fmha_memcpy)
    return host
end

"A stream (`fmha_stream_t`); `nothing` is the default stream. `close` destroys it."
mutable struct Stream
    handle::Ptr{Cvoid}
    closed::Bool
end

function Stream()
    s = Ref{Ptr{Cvoid}}(C_NULL)
    check(ccall((:fmha_stream_create, libfmha), Int32, (Ptr{Ptr{Cvoid}},), s), :fmha_stream_create)
    return Stream(s[], false)
end

stream_handle(::Nothing) = C_NULL
function stream_handle(s::Stream)
    # A closed stream's handle must not silently become NULL, the default stream.
    s.closed && throw(ArgumentError("the Stream is closed"))
    return s.handle
end

function Base.close(s::Stream)
    s.closed && return nothing
    s.closed = true
    check(ccall((:fmha_stream_destroy, libfmha), Int32, (Ptr{Cvoid},), s.handle), :fmha_stream_destroy)
end

"Waits for the work queued on `s` (`nothing`: the default stream) and reports its first error."
function synchronize(s::Union{Stream,Nothing} = nothing)
    handle = stream_handle(s)
    check(ccall((:fmha_stream_synchronize, libfmha), Int32, (Ptr{Cvoid},), handle), :fmha_stream_synchronize)
end

# ---- the forward --------------------------------------------------------------------------------------

# The C structs, field for field (include/fmha.h); Julia lays out isbits structs as C does. The test
# checks their sizes and offsets against the C compiler's.

"`fmha_tensor`: a strided `[batch][head][row][column]` view, strides in elements."
struct CTensor
    data::Ptr{Cvoid}
    batch_stride::Int64
    head_stride::Int64
    row_stride::Int64
end

"`fmha_scale`: fp8 descales (unused by this package: NULL data means 1)."
struct CScale
    data::Ptr{Cfloat}
    batch_stride::Int64
    head_stride::Int64
    page_stride::Int64
end

"`fmha_fwd_traits`."
struct FwdTraits
    struct_size::Csize_t
    dtype::Int32
    hdim_q::Int32
    hdim_v::Int32
    is_group_mode::Int32
    mask_type::Int32
    bias_type::Int32
    has_dropout::Int32
    o_dtype::Int32
end

"`fmha_fwd_args`."
struct FwdArgs
    struct_size::Csize_t
    q::CTensor
    k::CTensor
    v::CTensor
    o::CTensor
    lse::CTensor
    seqstart_q::Ptr{Int32}
    seqstart_k::Ptr{Int32}
    seqlen_q_ptr::Ptr{Int32}
    seqlen_k_ptr::Ptr{Int32}
    batch::Int32
    seqlen_q::Int32
    seqlen_k::Int32
    max_seqlen_q::Int32
    max_seqlen_k::Int32
    nhead_q::Int32
    nhead_k::Int32
    scale::Cfloat
    window_size_left::Int32
    window_size_right::Int32
    q_descale::CScale
    k_descale::CScale
    v_descale::CScale
end

const NO_TENSOR = CTensor(C_NULL, 0, 0, 0)
const NO_SCALE = CScale(Ptr{Cfloat}(C_NULL), 0, 0, 0)
const NO_INT32S = Ptr{Int32}(C_NULL)

"""
    tensor(b, batch_stride, head_stride, row_stride; offset = 0)

The view of `b` starting `offset` elements in, with strides in elements (columns contiguous).
"""
function tensor(b::DeviceBuffer{T}, batch_stride::Integer, head_stride::Integer, row_stride::Integer;
                offset::Integer = 0) where {T}
    0 <= offset <= length(b) || throw(ArgumentError("offset $offset is outside the buffer of $(length(b))"))
    return CTensor(Ptr{Cvoid}(open_ptr(b) + offset * sizeof(T)), batch_stride, head_stride, row_stride)
end

"""
    forward!(; dtype, q, k, v, o, lse, batch, seqlen_q, seqlen_k, nhead_q, nhead_k, hdim_q, hdim_v,
             mask_type, window, scale, stream)

Queues the attention forward (batch mode) on `stream` (`nothing`: the default stream) and returns
once queued: O = softmax(scale · Q Kᵀ + mask) V and, when `lse` is given, the fp32 natural-log LSE
`[batch][nhead_q][seqlen_q]` (row stride 1). `dtype` is `DTYPE_FP16` or `DTYPE_BF16`; `window` is
(left, right), -1 unbounded, causal by default when masked; `scale` 0 selects 1/sqrt(hdim_q).
Throws an `FmhaError` naming the bad field.
"""
function forward!(; dtype::Integer, q::CTensor, k::CTensor, v::CTensor, o::CTensor, lse::CTensor = NO_TENSOR,
                  batch::Integer, seqlen_q::Integer, seqlen_k::Integer, nhead_q::Integer, nhead_k::Integer,
                  hdim_q::Integer, hdim_v::Integer, mask_type::Integer = MASK_NONE,
                  window::Tuple{Integer,Integer} = mask_type == MASK_NONE ? (-1, -1) : (-1, 0),
                  scale::Real = 0, stream::Union{Stream,Nothing} = nothing)
    # o_dtype is read only for fp8 inputs, which this package does not offer.
    traits = FwdTraits(sizeof(FwdTraits), dtype, hdim_q, hdim_v, 0, mask_type, 0, 0, DTYPE_BF16)
    # max_seqlen_q/k: 0 in batch mode.
    args = FwdArgs(sizeof(FwdArgs), q, k, v, o, lse, NO_INT32S, NO_INT32S, NO_INT32S, NO_INT32S,
                   batch, seqlen_q, seqlen_k, 0, 0, nhead_q, nhead_k, scale, window[1], window[2],
                   NO_SCALE, NO_SCALE, NO_SCALE)
    handle = stream_handle(stream)
    status = ccall((:fmha_fwd, libfmha), Int32, (Ref{FwdTraits}, Ref{FwdArgs}, Ptr{Cvoid}), traits, args, handle)
    check(status, :fmha_fwd)
end

end # module
