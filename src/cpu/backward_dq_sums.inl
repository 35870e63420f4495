// The single pass's dQ sums (backward_fused): one task's, for every query
// row of its K/V head's group, kept where TilePlan::dq_sums says
// (tiling.hpp): in the workspace, in dq itself, or split between dq (each
// sum's upper 16 bits, which are the sum truncated to bf16) and 16 bits a
// sum in the workspace. Every form holds the same f32 (f64) sums, so the
// results are bitwise the same. Included by backward.inl.

// Sum x's bits as a bf16 upper half and a 16-bit lower half, and back.
// Contiguous halves (hi_stride 1) take a loop of their own, which vectorizes.
inline void split_sums(const float* x, int64_t n, uint16_t* hi, int64_t hi_stride, uint16_t* lo) {
  const auto split = [&](int64_t c, uint16_t& h) {
    uint32_t bits;
    std::memcpy(&bits, x + c, sizeof bits);
    h = static_cast<uint16_t>(bits >> 16);
    lo[c] = static_cast<uint16_t>(bits);
  };
  if (hi_stride == 1)
    for (int64_t c = 0; c < n; ++c) split(c, hi[c]);
  else
    for (int64_t c = 0; c < n; ++c) split(c, hi[c * hi_stride]);
}
inline void join_sums(const uint16_t* hi, int64_t hi_stride, const uint16_t* lo, int64_t n, float* x) {
  const auto join = [&](int64_t c, uint16_t h) {
    const uint32_t bits = uint32_t{h} << 16 | lo[c];
    std::memcpy(x + c, &bits, sizeof bits);
  };
  if (hi_stride == 1)
    for (int64_t c = 0; c < n; ++c) join(c, hi[c]);
  else
    for (int64_t c = 0; c < n; ++c) join(c, hi[c * hi_stride]);
}

template <typename Acc>
struct GroupDq {
  const AttnParams& p;
  int64_t b, hk, group, ldq;
  DqSums where;
  bool direct;  ///< in_dq with rows the tile products can add into where they lie
  Acc* sums;    ///< workspace form: [group, seqlen_q, ldq]; split: the lower halves, as uint16
  Acc* stage;   ///< one query block's sums, [block_q, ldq], for rows not added into directly

  // The group's sums in `part` (a key run's partial, always the workspace
  // form) or where the plan keeps them.
  GroupDq(const AttnParams& p_, const TilePlan& plan_, int64_t b_, int64_t hk_, Slice<Acc> ws, Acc* part)
      : p(p_), b(b_), hk(hk_), group(p_.heads_q / p_.heads_kv), ldq(plan_.dqk_pad),
        where(part ? DqSums::workspace : plan_.dq_sums),
        direct(where == DqSums::in_dq && p_.dq.dim_stride == 1 && p_.head_dim == ldq),
        sums(part ? part : ws.at(plan_.bwd.dq_acc)), stage(ws.at(plan_.bwd.dq_stage)) {}

  uint16_t* lo(int64_t g, int64_t i) const {
    return reinterpret_cast<uint16_t*>(sums) + (g * p.seqlen_q + i) * ldq;
  }
  template <typename G>
  G* out_row(int64_t g, int64_t i) const {
    return static_cast<G*>(p.dq.data) + row_offset(p.dq, b, p.q_start(b) + i, hk * group + g);
  }
  // Row i of head g as Acc into x (head_dim elements), from dq or its halves.
  void read(int64_t g, int64_t i, Acc* x) const {
    const int64_t s = p.dq.dim_stride;
    if constexpr (std::is_same<Acc, float>::value) {
      if (where == DqSums::split_dq) return join_sums(out_row<uint16_t>(g, i), s, lo(g, i), p.head_dim, x);
    }
    const Acc* row = out_row<Acc>(g, i);
    for (int64_t c = 0; c < p.head_dim; ++c) x[c] = row[c * s];
  }
  void write(int64_t g, int64_t i, const Acc* x) const {
    const int64_t s = p.dq.dim_stride;
    if constexpr (std::is_same<Acc, float>::value) {
      if (where == DqSums::split_dq) return split_sums(x, p.head_dim, out_row<uint16_t>(g, i), s, lo(g, i));
    }
    Acc* row = out_row<Acc>(g, i);
    for (int64_t c = 0; c < p.head_dim; ++c) row[c * s] = x[c];
  }

  void zero() {
    if (where == DqSums::workspace) {
      std::fill_n(sums, group * p.seqlen_q * ldq, Acc(0));
      return;
    }
    std::fill_n(stage, ldq, Acc(0));
    for (int64_t g = 0; g < group; ++g)
      for (int64_t i = 0; i < p.len_q(b); ++i) write(g, i, stage);
  }

  // Rows [i0, i0 + mq) of group head g as Acc rows for dQ += dS K, *ld apart.
  Acc* open(int64_t g, int64_t i0, int64_t mq, int64_t* ld) {
    *ld = direct ? p.dq.seq_stride : ldq;
    if (where == DqSums::workspace) return sums + (g * p.seqlen_q + i0) * ldq;
    if (direct) return out_row<Acc>(g, i0);
    for (int64_t r = 0; r < mq; ++r) {
      read(g, i0 + r, stage + r * ldq);
      std::fill(stage + r * ldq + p.head_dim, stage + (r + 1) * ldq, Acc(0));
    }
    return stage;
  }
  // After open(g, i0, mq): staged rows back where they are kept.
  void close(int64_t g, int64_t i0, int64_t mq) {
    if (where == DqSums::workspace || direct) return;
    for (int64_t r = 0; r < mq; ++r) write(g, i0 + r, stage + r * ldq);
  }

  // dQ = scale * sums, stored as dq's dtype.
  template <typename T>
  void finish() {
    const Acc scale = static_cast<Acc>(p.scale);
    for (int64_t g = 0; g < group; ++g)
      for (int64_t i = 0; i < p.len_q(b); ++i) {
        const Acc* src = sums + (g * p.seqlen_q + i) * ldq;
        if (where != DqSums::workspace) {
          read(g, i, stage);
          src = stage;
        }
        store_result<T>(p.grad_dtype, src, p.head_dim, p.dq.data,
                        row_offset(p.dq, b, p.q_start(b) + i, hk * group + g), p.dq.dim_stride, scale);
      }
  }
};
