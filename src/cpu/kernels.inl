// The kernel table of one ISA. Included by kernels_<isa>.cpp inside
// namespace flashgrad::cpu::<isa>, after its target options are set.

#ifndef NDEBUG
#define FG_DASSERT(x) assert(x)
#else
#define FG_DASSERT(x) ((void)0)
#endif

#include "vec.inl"
#include "rows.inl"
#include "rng.inl"
#include "scores.inl"
#include "forward.inl"
#include "backward.inl"

namespace {

template <template <typename, typename> class Fn>
void by_dtype(const AttnParams& p, const TilePlan& plan, void* ws) {
  switch (p.dtype) {
    case DType::f32: Fn<float, float>::run(p, plan, ws); break;
    case DType::f64: Fn<double, double>::run(p, plan, ws); break;
    case DType::bf16: Fn<bf16_t, float>::run(p, plan, ws); break;
    case DType::f16: Fn<f16_t, float>::run(p, plan, ws); break;
    default: FG_DASSERT(false && "unsupported dtype");
  }
}

template <typename T, typename Acc>
struct Fwd { static void run(const AttnParams& p, const TilePlan& t, void* w) { forward_impl<T, Acc>(p, t, w); } };
template <typename T, typename Acc>
struct Bwd { static void run(const AttnParams& p, const TilePlan& t, void* w) { backward_impl<T, Acc>(p, t, w); } };

void forward_entry(const AttnParams& p, const TilePlan& plan, void* ws) { by_dtype<Fwd>(p, plan, ws); }
void backward_entry(const AttnParams& p, const TilePlan& plan, void* ws) { by_dtype<Bwd>(p, plan, ws); }

void dropout_mask_entry(const AttnParams& p, uint8_t* keep) {
  const int64_t lq = p.seqlen_q, lk = p.seqlen_k;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const Philox rng = Philox::make(p, b, h);
      for (int64_t i = 0; i < lq; ++i) rng.keep_row(i, 0, lk, keep + ((b * p.heads_q + h) * lq + i) * lk);
    }
}

ForwardChoice forward_path_entry(const AttnParams& p, const TilePlan& plan) {
  switch (p.dtype) {
    case DType::f64: return first_task_path<double, double>(p, plan);
    case DType::bf16: return first_task_path<bf16_t, float>(p, plan);
    case DType::f16: return first_task_path<f16_t, float>(p, plan);
    default: return first_task_path<float, float>(p, plan);
  }
}

}  // namespace

extern const KernelTable table;
const KernelTable table = {FG_ISA_ENUM, FG_ISA_NAME, forward_entry, backward_entry, dropout_mask_entry,
                           forward_path_entry};
