// fmha's attention as a PyTorch operator with a C++ autograd node: `torch.ops.fmha.attention`.
//
// Why: a Python `torch.autograd.Function` costs a training step more host time than all of fmha's own
// work (docs/perf.md), and autograd runs a Python backward on its device thread, which must take the
// GIL. This node's backward is C++ and never enters Python.
//
// The Python layer (fmha/ops.py) keeps everything that checks a call: calls of a signature run their
// full checks on the Python path until it builds a `Plan` here (`plan_create`) from the C argument
// structs those checks built; later calls of that signature come here, and only the data pointers and
// strides change. The plan calls libfmha through function pointers that the Python layer passes in (the
// library ctypes loaded), so this file needs no link to libfmha and both use one library instance.
//
// No Python C API: the operators go through PyTorch's dispatcher, so the shared object depends on the
// PyTorch version it was built against (its file name carries it), not on Python's.

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fmha.h"

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The libfmha entry points a plan calls. Python looks these names up in the library it loaded and passes
// their addresses in this order (`plan_functions`, fmha/_native.py's Plan), so the list exists once.
constexpr std::array<const char *, 7> kFunctions = {
    "fmha_fwd",
    "fmha_bwd_launcher_create",
    "fmha_bwd_launcher_destroy",
    "fmha_bwd_launcher_workspace_size",
    "fmha_bwd_launcher_prepare_workspace_async",
    "fmha_bwd_launcher_run",
    "fmha_last_error_message",
};

constexpr size_t function_index(std::string_view name) {
  for (size_t i = 0; i < kFunctions.size(); ++i) {
    if (name == kFunctions[i]) return i;
  }
  return kFunctions.size();
}

struct Library {
  decltype(&fmha_fwd) fwd;
  decltype(&fmha_bwd_launcher_create) create;
  decltype(&fmha_bwd_launcher_destroy) destroy;
  decltype(&fmha_bwd_launcher_workspace_size) workspace_size;
  decltype(&fmha_bwd_launcher_prepare_workspace_async) prepare_async;
  decltype(&fmha_bwd_launcher_run) run;
  decltype(&fmha_last_error_message) last_error_message;

  // SAFETY of the cast: Python passes the address of the function named kFunctions[kIndex] in the loaded
  // libfmha; the prototype `F` comes from the header the library was built from.
  template <typename F, size_t kIndex>
  static F resolve(const std::vector<int64_t> &addresses) {
    static_assert(kIndex < kFunctions.size(), "a function kFunctions does not list");
    return reinterpret_cast<F>(addresses[kIndex]);
  }

  explicit Library(const std::vector<int64_t> &addresses) {
    TORCH_CHECK(addresses.size() == kFunctions.size(), "fmha: a plan takes ", kFunctions.size(),
                " function addresses, got ", addresses.size());
    for (int64_t a : addresses) TORCH_CHECK(a != 0, "fmha: a plan's function address is NULL");
    fwd = resolve<decltype(fwd), function_index("fmha_fwd")>(addresses);
    create = resolve<decltype(create), function_index("fmha_bwd_launcher_create")>(addresses);
    destroy = resolve<decltype(destroy), function_index("fmha_bwd_launcher_destroy")>(addresses);
    workspace_size =
        resolve<decltype(workspace_size), function_index("fmha_bwd_launcher_workspace_size")>(addresses);
    prepare_async =
        resolve<decltype(prepare_async), function_index("fmha_bwd_launcher_prepare_workspace_async")>(addresses);
    run = resolve<decltype(run), function_index("fmha_bwd_launcher_run")>(addresses);
    last_error_message = resolve<decltype(last_error_message), function_index("fmha_last_error_message")>(addresses);
  }

  // Throws (a RuntimeError in Python) with the library's message when `status` is not FMHA_OK. The
  // message is thread-local: read here, on the thread that made the call.
  void check(fmha_status status, const char *function) const {
    if (status == FMHA_OK) return;
    std::string message(last_error_message(nullptr, 0), '\0');
    last_error_message(message.data(), message.size() + 1);
    TORCH_CHECK(false, "fmha: ", function, " failed (status ", status, "): ", message);
  }
};

// A C struct from the bytes ops.py built with ctypes (the same layout: ctypes mirrors fmha.h, and
// tests/python check the sizes).
template <typename T>
T from_bytes(const at::Tensor &bytes, const char *name) {
  TORCH_CHECK(bytes.device().is_cpu() && bytes.scalar_type() == at::kByte && bytes.is_contiguous() &&
                  bytes.numel() == static_cast<int64_t>(sizeof(T)),
              "fmha: ", name, " must be ", sizeof(T), " contiguous CPU bytes");
  T value;
  std::memcpy(&value, bytes.data_ptr(), sizeof(T));
  return value;
}

void *address(const at::Tensor &t) { return t.numel() ? t.data_ptr() : nullptr; }

// [batch, seq, head, dim] (batch mode) or [total, head, dim] (group mode) → fmha_tensor.
fmha_tensor rows(const at::Tensor &t, bool group) {
  if (group) return {address(t), 0, t.stride(1), t.stride(0)};
  return {address(t), t.stride(0), t.stride(2), t.stride(1)};
}

// The LSE layout: [batch, head, seq] (batch mode) or [head, total] (group mode), fp32.
fmha_tensor lse_rows(const at::Tensor &t, bool group) {
  if (group) return {address(t), 0, t.stride(0), t.stride(1)};
  return {address(t), t.stride(0), t.stride(1), t.stride(2)};
}

const int32_t *starts(const std::optional<at::Tensor> &t) {
  return t.has_value() && t->defined() ? static_cast<const int32_t *>(address(*t)) : nullptr;
}

// A call's lengths. Batch mode: the plan's (its key holds the shapes). Group mode: the totals are the rows
// of q and k, the maxima the caller's bounds, clamped to the totals as ops.py's _Problem clamps them; a
// plan serves every call whose values fall in the power-of-two buckets of its key (its backward
// launcher's bounds).
struct Lengths {
  int32_t seqlen_q, seqlen_k, max_seqlen_q, max_seqlen_k;
};

// The current PyTorch stream of `device` as the library's stream handle (cudaStream_t / hipStream_t).
fmha_stream_t current_stream(const c10::Device &device) {
  const auto *impl = c10::impl::getDeviceGuardImpl(device.type());
  return impl->getStream(device).native_handle();
}

}  // namespace

// One call signature's forward and backward: the argument structs of a call that ran the full checks, and
// the backward launcher with a workspace per stream.
struct Plan : torch::CustomClassHolder {
  Plan(std::vector<int64_t> functions, at::Tensor fwd_traits, at::Tensor fwd_args, int64_t fwd_workspace_bytes,
       at::Tensor bwd_traits, at::Tensor bwd_args, int64_t prepare_method, int64_t vector_bytes)
      : lib(functions),
        fwd_traits(from_bytes<fmha_fwd_traits>(fwd_traits, "fwd_traits")),
        fwd_args(from_bytes<fmha_fwd_args>(fwd_args, "fwd_args")),
        fwd_workspace_bytes(fwd_workspace_bytes),
        bwd_traits(from_bytes<fmha_bwd_traits>(bwd_traits, "bwd_traits")),
        bwd_args(from_bytes<fmha_bwd_args>(bwd_args, "bwd_args")),
        prepare_method(static_cast<int32_t>(prepare_method)),
        vector_bytes(vector_bytes),
        group(this->fwd_traits.is_group_mode != 0) {
    TORCH_CHECK(fwd_workspace_bytes >= 0, "fmha: fwd_workspace_bytes must be >= 0, got ", fwd_workspace_bytes);
  }

  ~Plan() override {
    // Safe while the launcher's work is queued (fmha_bwd_launcher_destroy's contract).
    if (launcher != nullptr) lib.destroy(launcher);
  }

  // dO as the kernels read it: q's dtype, last dimension contiguous, vector-aligned where the build
  // needs it (what ops.py's _prepare_input does for the Python path).
  at::Tensor readable(at::Tensor dout, at::ScalarType dtype) const {
    if (dout.scalar_type() != dtype) dout = dout.to(dtype);
    if (dout.dim() > 0 && dout.size(-1) > 1 && dout.stride(-1) != 1) dout = dout.contiguous();
    if (vector_bytes == 0 || dout.numel() == 0) return dout;
    const int64_t size = dout.element_size();
    bool misaligned = reinterpret_cast<uintptr_t>(dout.data_ptr()) % vector_bytes != 0;
    for (int64_t i = 0; i + 1 < dout.dim(); ++i) misaligned |= (dout.stride(i) * size) % vector_bytes != 0;
    if (misaligned && (dout.size(-1) * size) % vector_bytes == 0) return dout.clone(at::MemoryFormat::Contiguous);
    return dout;
  }

  Lengths lengths(const at::Tensor &q, const at::Tensor &k, int64_t max_seqlen_q, int64_t max_seqlen_k) const {
    if (!group) return {fwd_args.seqlen_q, fwd_args.seqlen_k, fwd_args.max_seqlen_q, fwd_args.max_seqlen_k};
    const int64_t total_q = q.size(0), total_k = k.size(0);
    return {static_cast<int32_t>(total_q), static_cast<int32_t>(total_k),
            static_cast<int32_t>(std::clamp<int64_t>(max_seqlen_q, 0, total_q)),
            static_cast<int32_t>(std::clamp<int64_t>(max_seqlen_k, 0, total_k))};
  }

  // out: q's shape with v's head dim; LSE: [batch, head, seq] or [head, total].
  std::vector<int64_t> out_shape(const at::Tensor &q) const {
    std::vector<int64_t> shape = q.sizes().vec();
    shape.back() = fwd_traits.hdim_v;
    return shape;
  }
  std::vector<int64_t> lse_shape(const at::Tensor &q) const {
    if (group) return {q.size(1), q.size(0)};
    return {q.size(0), q.size(2), q.size(1)};
  }

  // What the forward's and the backward's argument structs share (the same field names): the lengths,
  // q, k, v, the output, the LSE and the sequence starts.
  template <typename Args>
  void describe(Args &args, const Lengths &lengths, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                const at::Tensor &out, const at::Tensor &lse, const std::optional<at::Tensor> &cu_seqlens_q,
                const std::optional<at::Tensor> &cu_seqlens_k) const {
    args.seqlen_q = lengths.seqlen_q;
    args.seqlen_k = lengths.seqlen_k;
    args.max_seqlen_q = lengths.max_seqlen_q;
    args.max_seqlen_k = lengths.max_seqlen_k;
    args.q = rows(q, group);
    args.k = rows(k, group);
    args.v = rows(v, group);
    args.o = rows(out, group);
    args.lse = lse_rows(lse, group);
    args.seqstart_q = starts(cu_seqlens_q);
    args.seqstart_k = starts(cu_seqlens_k);
  }

  // The scheduler workspace (fmha_fwd_workspace_size bytes, a tile counter the call zeroes) is a temporary
  // of the call's stream, as any operator's: the caching allocator hands it to a later allocation on that
  // stream only, so calls on other streams or threads never share one, and under CUDA-graph capture it
  // comes from the graph's private pool, which keeps it for the replays.
  void forward(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
               const at::Tensor &lse, const std::optional<at::Tensor> &cu_seqlens_q,
               const std::optional<at::Tensor> &cu_seqlens_k, const Lengths &lengths) const {
    fmha_fwd_args args = fwd_args;
    describe(args, lengths, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k);
    at::Tensor workspace;
    if (fwd_workspace_bytes > 0) workspace = at::empty({fwd_workspace_bytes}, q.options().dtype(at::kByte));
    args.workspace = workspace.defined() ? workspace.data_ptr() : nullptr;
    args.workspace_size = static_cast<size_t>(fwd_workspace_bytes);
    lib.check(lib.fwd(&fwd_traits, &args, current_stream(q.device())), "fmha_fwd");
  }

  // dq, dk, dv for dO. On a failure the launcher is dropped (its queued work's failure would be
  // reported again by every later call) and made anew by the next backward, as ops.py's cache evicts.
  variable_list backward(const at::Tensor &dout_given, const variable_list &saved, const Lengths &lengths) {
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const std::optional<at::Tensor> cu_seqlens_q = saved[5].defined() ? std::optional(saved[5]) : std::nullopt;
    const std::optional<at::Tensor> cu_seqlens_k = saved[6].defined() ? std::optional(saved[6]) : std::nullopt;
    c10::DeviceGuard guard(q.device());
    const at::Tensor dout = readable(dout_given, q.scalar_type());
    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v), d = at::empty_like(lse);
    fmha_bwd_args args = bwd_args;
    describe(args, lengths, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k);
    args.d_o = rows(dout, group);
    args.d = lse_rows(d, group);
    args.dq = rows(dq, group);
    args.dk = rows(dk, group);
    args.dv = rows(dv, group);
    fmha_stream_t stream = current_stream(q.device());

    std::lock_guard<std::mutex> lock(mutex);
    try {
      if (launcher == nullptr) {
        lib.check(lib.create(&bwd_traits, &launcher), "fmha_bwd_launcher_create");
        lib.check(lib.workspace_size(launcher, &workspace_bytes), "fmha_bwd_launcher_workspace_size");
      }
      // One workspace per stream, reused by later calls on it (stream order keeps them apart). A
      // batch-mode workspace depends on the launcher alone and `run` initializes its dq_acc region, so
      // it is prepared once; a varlen one again for each call's sequence starts.
      auto [entry, fresh] = workspaces.try_emplace(stream);
      if (fresh) {
        entry->second = at::empty({static_cast<int64_t>(std::max<size_t>(workspace_bytes, 1))},
                                  q.options().dtype(at::kByte));
      }
      void *workspace = entry->second.data_ptr();
      if (fresh || group) {
        lib.check(lib.prepare_async(launcher, workspace, workspace_bytes, args.seqstart_q, args.seqstart_k, stream,
                                    nullptr, prepare_method),
                  "fmha_bwd_launcher_prepare_workspace_async");
      }
      args.workspace = workspace;
      args.workspace_size = workspace_bytes;  // the library checks it against the launcher's
      lib.check(lib.run(launcher, &args, stream), "fmha_bwd_launcher_run");
    } catch (...) {
      workspaces.clear();
      if (launcher != nullptr) lib.destroy(launcher);
      launcher = nullptr;
      throw;
    }
    return {dq, dk, dv};
  }

  const Library lib;
  const fmha_fwd_traits fwd_traits;
  const fmha_fwd_args fwd_args;
  const int64_t fwd_workspace_bytes;
  const fmha_bwd_traits bwd_traits;
  const fmha_bwd_args bwd_args;
  const int32_t prepare_method;
  const int64_t vector_bytes;
  const bool group;

  std::mutex mutex;  // the launcher and the workspaces: backwards may run on several threads
  fmha_bwd_launcher *launcher = nullptr;
  size_t workspace_bytes = 0;
  std::unordered_map<fmha_stream_t, at::Tensor> workspaces;
};

namespace {

struct Attention : torch::autograd::Function<Attention> {
  static variable_list forward(AutogradContext *ctx, const at::Tensor &q, const at::Tensor &k,
                               const at::Tensor &v, const std::optional<at::Tensor> &cu_seqlens_q,
                               const std::optional<at::Tensor> &cu_seqlens_k, int64_t max_seqlen_q,
                               int64_t max_seqlen_k, const c10::intrusive_ptr<Plan> &plan) {
    c10::DeviceGuard guard(q.device());
    const Lengths lengths = plan->lengths(q, k, max_seqlen_q, max_seqlen_k);
    at::Tensor out = at::empty(plan->out_shape(q), q.options());
    at::Tensor lse = at::empty(plan->lse_shape(q), q.options().dtype(at::kFloat));
    plan->forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, lengths);
    ctx->save_for_backward({q, k, v, out, lse, cu_seqlens_q.value_or(at::Tensor()),
                            cu_seqlens_k.value_or(at::Tensor())});
    ctx->saved_data["plan"] = plan;
    ctx->saved_data["lengths"] = std::vector<int64_t>{lengths.seqlen_q, lengths.seqlen_k, lengths.max_seqlen_q,
                                                      lengths.max_seqlen_k};
    // LSE has no gradient; without materialized grads autograd builds no zero tensor for it (ops.py's
    // FmhaAttnFunc says what that costs).
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);
    return {out, lse};
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    const at::Tensor &dout = grads[0];
    if (!dout.defined()) return variable_list(8);  // out took no part in the loss
    auto plan = ctx->saved_data["plan"].toCustomClass<Plan>();
    const auto l = ctx->saved_data["lengths"].toIntVector();
    const Lengths lengths{static_cast<int32_t>(l[0]), static_cast<int32_t>(l[1]), static_cast<int32_t>(l[2]),
                          static_cast<int32_t>(l[3])};
    variable_list d = plan->backward(dout, ctx->get_saved_variables(), lengths);
    return {d[0], d[1], d[2], at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The plans Python holds, by id. Python passes an id rather than the plan object: converting a
// TorchScript class argument costs a call more host time than the attention's own launch. Autograd
// nodes hold their plan, so releasing an id ends only Python's share.
class PlanTable {
 public:
  int64_t add(c10::intrusive_ptr<Plan> plan) {
    std::lock_guard<std::mutex> lock(mutex_);
    plans_.emplace(next_, std::move(plan));
    return next_++;
  }

  c10::intrusive_ptr<Plan> get(int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = plans_.find(id);
    TORCH_CHECK(found != plans_.end(), "fmha: plan ", id, " does not exist (released, or never created)");
    return found->second;
  }

  void release(int64_t id) {
    c10::intrusive_ptr<Plan> plan;  // destroyed after the lock is dropped (it may destroy a launcher)
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = plans_.find(id);
    if (found == plans_.end()) return;
    plan = std::move(found->second);
    plans_.erase(found);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<int64_t, c10::intrusive_ptr<Plan>> plans_;
  int64_t next_ = 1;
};

PlanTable &plans() {
  static PlanTable *table = new PlanTable;  // never destroyed: plans may outlive static destruction order
  return *table;
}

int64_t plan_create(std::vector<int64_t> functions, at::Tensor fwd_traits, at::Tensor fwd_args,
                    int64_t fwd_workspace_bytes, at::Tensor bwd_traits, at::Tensor bwd_args, int64_t prepare_method,
                    int64_t vector_bytes) {
  return plans().add(c10::make_intrusive<Plan>(std::move(functions), fwd_traits, fwd_args, fwd_workspace_bytes,
                                               bwd_traits, bwd_args, prepare_method, vector_bytes));
}

void plan_release(int64_t id) { plans().release(id); }

std::vector<std::string> plan_functions() { return {kFunctions.begin(), kFunctions.end()}; }

std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                             const std::optional<at::Tensor> &cu_seqlens_q,
                                             const std::optional<at::Tensor> &cu_seqlens_k, int64_t max_seqlen_q,
                                             int64_t max_seqlen_k, int64_t plan) {
  variable_list outputs =
      Attention::apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, plans().get(plan));
  return {outputs[0], outputs[1]};
}

}  // namespace

TORCH_LIBRARY(fmha, m) {
  m.class_<Plan>("Plan");  // so that an autograd node's saved data can hold one
  m.def(
      "plan_create(int[] functions, Tensor fwd_traits, Tensor fwd_args, int fwd_workspace_bytes, Tensor bwd_traits, "
      "Tensor bwd_args, int prepare_method, int vector_bytes) -> int",
      &plan_create);
  m.def("plan_release(int plan) -> ()", &plan_release);
  m.def("plan_functions() -> str[]", &plan_functions);
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, "
      "int max_seqlen_k, int plan) -> (Tensor, Tensor)",
      &attention);
}
