// Verify: launchers: grid / cluster policy and the host entry points. Part of
// csrc/verify/verify.cuh (the umbrella header); includes the part before it.
#pragma once

#include "verify/strict_kernel.cuh"

namespace tokenspeed_kernel::verify {

// ------------------------------------------------------------------------------------------
// launchers
// ------------------------------------------------------------------------------------------
// Launch configuration of `blocks` CTAs of kThreads threads, in clusters of cs (cs > 1; attr is
// the storage for the cluster attribute) or without clusters (cs <= 1).
inline cudaLaunchConfig_t launch_config(int64_t blocks, unsigned cs, cudaStream_t stream,
                                        cudaLaunchAttribute (&attr)[1]) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(blocks), 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  if (cs > 1) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cs;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return cfg;
}
template <typename Kernel>
inline cudaError_t launch_maybe_cluster(Kernel kernel, bool cluster, unsigned cs, int64_t blocks,
                                        cudaStream_t stream, const VerifyParams& p) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = launch_config(blocks, cluster ? cs : 1u, stream, attr);
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

// A host-side query about a kernel (occupancy, cluster size), computed once per (device,
// kernel): function attributes such as the non-portable cluster size are set per device, and
// devices of one process may differ. Each call site has its own cache and lock: F is the call
// site's lambda, whose type is its own in every instance of the calling template.
template <typename Kernel, typename F>
inline int cached_per_device(Kernel kernel, F&& compute) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> cache;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) (void)cudaGetLastError();
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(dev, reinterpret_cast<const void*>(kernel));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const int v = compute();
  cache.emplace(key, v);
  return v;
}

// Resident CTAs per SM of a kernel (kThreads threads, static shared memory only).
template <typename Kernel>
inline int resident_per_sm(Kernel kernel) {
  return cached_per_device(kernel, [&]() {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0) != cudaSuccess ||
        n < 1) {
      (void)cudaGetLastError();
      n = 1;
    }
    return n;
  });
}

// Clusters of cs CTAs (kThreads threads each) of a kernel that can be resident at once
// (cudaOccupancyMaxActiveClusters; cs >= 2); 0 if the query fails. Uncached: the callers below
// cache.
template <typename Kernel>
inline int active_clusters(Kernel kernel, unsigned cs) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = launch_config(cs, cs, nullptr, attr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess || clusters < 0) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  return clusters;
}

// CTAs of a cluster kernel resident at once in clusters of CS: active_clusters x CS (0 if the
// query fails). CS = 16 needs the non-portable attribute (max_cluster sets it).
template <int CS, typename Kernel>
inline int cluster_capacity(Kernel kernel) {
  return cached_per_device(kernel, [&]() { return active_clusters(kernel, CS) * CS; });
}

// Largest cluster size (16, non-portable, or the portable 8) that the device can schedule for a
// kernel of kThreads threads. Setting the non-portable attribute is harmless where 16 is refused
// (then 8 is used).
template <typename Kernel>
inline int max_cluster(Kernel kernel) {
  return cached_per_device(kernel, [&]() {
    int best = 8;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
            cudaSuccess &&
        active_clusters(kernel, unsigned(kMaxCluster)) >= 1)
      best = kMaxCluster;
    (void)cudaGetLastError();
    return best;
  });
}

// CTAs per unit (row or request) splitting a V-element row into chunks: minimizes the estimated
// time waves(units * s) * (V / s + kSplitOverhead), i.e. prefers a split that fills whole waves of
// resident CTAs (a partial second wave costs as much as a full one), with chunks of at least
// min_chunk elements (s = 1 always allowed). kSplitOverhead: a CTA's fixed cost (launch, the walk,
// reductions) in element-equivalents.
constexpr int64_t kSplitOverhead = 4096;
inline int pick_splits(int64_t units, int64_t V, int64_t resident, int max_splits,
                       int64_t min_chunk) {
  if (resident < 1) resident = 1;
  int best = 1;
  double best_cost = 0.0;
  for (int s = 1; s <= max_splits; ++s) {
    const int64_t chunk = (V + s - 1) / s;
    if (s > 1 && chunk < min_chunk) break;
    const int64_t waves = (units * s + resident - 1) / resident;
    const double cost = double(waves) * double(chunk + kSplitOverhead);
    if (s == 1 || cost < best_cost * 0.999) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

// Pos-kernel CTAs per row (the cluster size), a power of two <= max_cs: minimizes
// waves(rows * s) * (chunk bytes + kPosCtaBytes), where a wave is what can be resident at once:
// res[0] CTAs of the one-CTA-per-row kernel, res[log2 s] CTAs of the cluster kernel in clusters
// of s (cluster_capacity: clusters must fit in a GPC, so fewer than CTAs/SM x SMs -- on an H200
// at 4 CTAs/SM 528 / 496 / 496 / 448 for s = 2 / 4 / 8 / 16). kPosCtaBytes is a CTA's fixed
// cost (row lookups, reductions, cluster syncs, the coin) in bytes streamed, fitted to sweeps
// of every power of two on an H200 (bench/lab/tools/verify_sweep.py pos). At the 30 shapes of
// bench/results/h200/verify_sweep_pos.csv the size it picks (computed from the capacities that
// bench/lab/tools/verify_occupancy.cu prints) is the fastest swept size at 27 and within 4.9 % of it at
// all (the sweep's own "pick" rows differ from the same size's rows by up to 6 %: noise between
// two measurements). Without the cluster capacity (waves of CTAs/SM x SMs) it picked clusters
// of 16 for bs 16, n 1, bf16 once the 16-bit kernel reached 4 CTAs/SM: 17.2 vs 14.0 us.
constexpr int64_t kPosCtaBytes = 65536;
inline int pick_pos_splits(int64_t rows, int64_t V, int elem_bytes, const int64_t (&res)[5],
                           int max_cs) {
  int best = 1;
  double best_cost = 0.0;
  for (int s = 1, l = 0; s <= max_cs && l < 5; s *= 2, ++l) {
    const int64_t chunk = (V + s - 1) / s;
    if (s > 1 && chunk < 4096) break;
    const int64_t r = std::max<int64_t>(1, res[l]);
    const int64_t waves = (rows * s + r - 1) / r;
    const double cost = double(waves) * double(chunk * elem_bytes + kPosCtaBytes);
    if (s == 1 || cost < best_cost * 0.999) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

// Tuning hook for bench/lab/tools/verify_sweep.py: with TOKENSPEED_VERIFY_TUNING set (read once), the
// launcher takes the pos kernel's cluster size from TS_VERIFY_CS and the final kernel's splits
// from TS_VERIFY_FS (read per call) when they are positive. Off by default; never needed.
inline bool tuning_enabled() {
  static const bool on = getenv("TOKENSPEED_VERIFY_TUNING") != nullptr;
  return on;
}

// Final-kernel CTAs per request (the launcher and the workspace sizing both use it).
template <typename T>
inline int verify_final_splits(int64_t bs, int64_t V, int sms, bool vec_ok) {
  constexpr int VEC = 16 / sizeof(T);
  const int occ = vec_ok ? resident_per_sm(verify_final_kernel<T, VEC>)
                         : resident_per_sm(verify_final_kernel<T, 1>);
  if (tuning_enabled()) {
    const char* f = getenv("TS_VERIFY_FS");
    if (f != nullptr && atoi(f) > 0)
      return std::max(1, std::min<int>(atoi(f), int((V + 2047) / 2048)));
  }
  return pick_splits(bs, V, int64_t(occ) * sms, 128, 2048);
}

// sms: the device's SM count; clusters: thread-block clusters available (sm_90+); ws.cand /
// ws.count (final kernel), p.rcount (resolve kernel) and p.flist must hold bs entries, p.racc
// 2 max(R_t, bs) (zeroed by the pos kernel, which therefore always runs with at least bs row
// blocks);
// ws.splits from verify_final_splits, ws.state bs * ws.splits entries (when p.flist is set);
// vec_ok: rows 16-byte aligned.
//
// Order: pos, then either (p.flist null, or logprobs) resolve + final over every request, or
// final (first pass: tokens decided from the approximate sums where their error bounds leave no
// doubt) + resolve + final (second pass) over the requests the first pass listed -- usually none
// or a few, so those two run on a fixed grid of one wave with each listed request split finely.
// Workspace of the radix thresholds (p.thr set, kBisectThresholds clear): sized by
// verify_thr_ws_bytes, carved by verify_thr_ws.
struct ThrWs {
  sampling::Workspace ws;  // part [rows * splits], then the levels' (sampling::level_ws_carve)
  int32_t* row_req;        // [rows]
  int32_t splits, chunk;
};
inline void verify_thr_split(int64_t rows, int V, int sms, int32_t& splits, int32_t& chunk) {
  const int s = sampling::choose_splits(int(std::min<int64_t>(rows, 1 << 30)), V, sms);
  const int64_t c = ((int64_t(V) + s - 1) / s + 7) / 8 * 8;
  chunk = int32_t(c);
  splits = int32_t((V + c - 1) / c);
}
inline int64_t verify_thr_ws_bytes(int64_t rows, int splits) {
  using sampling::ws_align;
  return ws_align(rows * splits * int64_t(sizeof(sampling::Partial))) + ws_align(rows * 4) +
         sampling::level_ws_bytes(rows, splits);
}
inline ThrWs verify_thr_ws(uint8_t* base, int64_t rows, int32_t splits, int32_t chunk) {
  using sampling::ws_align;
  ThrWs t{};
  t.splits = splits;
  t.chunk = chunk;
  t.ws.part = reinterpret_cast<sampling::Partial*>(base);
  base += ws_align(rows * splits * int64_t(sizeof(sampling::Partial)));
  t.row_req = reinterpret_cast<int32_t*>(base);
  base += ws_align(rows * 4);
  sampling::level_ws_carve(base, rows, splits, t.ws);  // state, histograms, lists
  return t;
}

// Kept-set thresholds of every target and draft row into p.thr: the radix select (pass 0 here,
// then the sampler's init and levels), or the bisection oracle (kBisectThresholds).
template <typename T, int VEC>
inline cudaError_t launch_verify_thresholds(const VerifyParams& p, const ThrWs& tw,
                                            cudaStream_t stream) {
  const int64_t rows = p.R_t + p.R_d;
  if (p.flags & kBisectThresholds) {
    verify_threshold_kernel<T, VEC><<<unsigned(rows), kThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
    const dim3 grid(unsigned(tw.splits), unsigned(std::min<int64_t>(65535, rows - r0)));
    verify_thr_max_kernel<T, VEC>
        <<<grid, kThreads, 0, stream>>>(p, r0, tw.chunk, tw.splits, tw.row_req, tw.ws.part);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  sampling::Params sp{};
  sp.logits = p.tgt;
  sp.row_stride = p.stride_t;
  sp.logits2 = p.R_d > 0 ? p.drf : nullptr;
  sp.row_stride2 = p.stride_d;
  sp.rows1 = int(p.R_t);
  sp.rows = int(rows);
  sp.vocab = p.V;
  sp.tpr = 1;
  sp.temperature = p.temperature;
  sp.top_k = p.top_k;
  sp.top_p = p.top_p;
  sp.flags = sampling::F_THRESHOLDS | (p.temperature ? F_TEMP : 0) | (p.top_k ? F_TOPK : 0) |
             (p.top_p ? F_TOPP : 0) | ((p.flags & kNoLevelList) ? sampling::F_NO_LIST : 0) |
             ((p.flags & kNoLevelExcl) ? sampling::F_NO_EXCL : 0) |
             ((p.flags & kLevelExclTest) ? sampling::F_EXCL_TEST : 0);
  sp.splits = tw.splits;
  sp.chunk = tw.chunk;
  sp.row_req = tw.row_req;
  sp.thr_out = p.thr;
  return sampling::launch_levels<T>(sp, tw.ws, stream);
}

template <typename T, int VEC>
inline cudaError_t launch_verify_probabilistic_v(VerifyParams p, int sms, bool clusters, FinalWs ws,
                                                 const ThrWs& tw, cudaStream_t stream) {
  auto chunk_of = [&](int c) {
    const int64_t per = (int64_t(p.V) + c - 1) / c;
    return int32_t((per + 7) / 8 * 8);
  };
  const bool two_pass = p.flist != nullptr && ws.state != nullptr && !(p.flags & kLogprobs);
  if (!two_pass) {
    p.flist = nullptr;
    p.fcount = nullptr;
  }
  cudaError_t e;
  if (p.thr != nullptr && p.R_t + p.R_d > 0) {
    e = launch_verify_thresholds<T, VEC>(p, tw, stream);
    if (e != cudaSuccess) return e;
  }
  // 1. statistics: cs_pos CTAs (a cluster) per row
  {
    const int64_t rows = p.R_t > p.bs ? p.R_t : int64_t(p.bs);
    constexpr int PU = pos_pu<T>();  // vectors per row in flight (coin_margin counts on it)
    auto k1 = verify_pos_kernel<T, VEC, false, PU>;
    auto kc = verify_pos_kernel<T, VEC, true, PU>;
    const int cs_max = clusters ? max_cluster(kc) : 1;  // (sets the non-portable attribute)
    const int64_t occc = int64_t(resident_per_sm(kc)) * sms;
    auto cap = [&](int64_t c) { return c > 0 ? c : occc; };  // query failed: CTAs/SM x SMs
    const int64_t res[5] = {int64_t(resident_per_sm(k1)) * sms,
                            cs_max >= 2 ? cap(cluster_capacity<2>(kc)) : 0,
                            cs_max >= 4 ? cap(cluster_capacity<4>(kc)) : 0,
                            cs_max >= 8 ? cap(cluster_capacity<8>(kc)) : 0,
                            cs_max >= 16 ? cap(cluster_capacity<16>(kc)) : 0};
    int cs_pos = pick_pos_splits(rows, p.V, int(sizeof(T)), res, cs_max);
    if (tuning_enabled()) {
      const char* f = getenv("TS_VERIFY_CS");
      if (f != nullptr && atoi(f) > 0) cs_pos = std::min(atoi(f), cs_max);
    }
    VerifyParams pp = p;
    pp.chunk = chunk_of(cs_pos);
    // Position-major order with skips (verify_pos_kernel): only where the grid leaves blocks
    // for a later wave (else every position runs at once and none can be skipped), and the
    // bs * W grid has no more than a quarter of empty rows (ragged).
    const int64_t vgrid = int64_t(p.bs) * (int64_t(p.max_n) + 1);
    int l = 0;  // res[] index of the size: log2 (a forced size is rounded down)
    while (l < 4 && (2 << l) <= cs_pos) ++l;
    bool pm =
        p.stop != nullptr && rows * cs_pos > res[l] && vgrid >= rows && vgrid <= rows + rows / 4;
    if (tuning_enabled() && getenv("TS_VERIFY_NOSKIP") != nullptr) pm = false;
    if (pm) {
      e = cudaMemsetAsync(pp.stop, 0, size_t(p.bs) * sizeof(int32_t), stream);
      if (e != cudaSuccess) return e;
    } else {
      pp.stop = nullptr;
    }
    const int64_t grows = pm ? vgrid : rows;
    e = cs_pos > 1 ? launch_maybe_cluster(kc, true, cs_pos, grows * cs_pos, stream, pp)
                   : launch_maybe_cluster(k1, false, 1, grows, stream, pp);
    if (e != cudaSuccess) return e;
    p.chunk = pp.chunk;
    p.stop = nullptr;  // the later kernels do not use it
  }
  const int64_t res_r = int64_t(resident_per_sm(verify_resolve_kernel<T, VEC>)) * sms;
  const int64_t res_f = int64_t(resident_per_sm(verify_final_kernel<T, VEC>)) * sms;
  if (!two_pass) {
    // 2. exact sums of every request's deciding position, 3. the final token
    p.rsplits = pick_splits(p.bs, p.V, res_r, 128, 2048);
    p.rchunk = chunk_of(p.rsplits);
    verify_resolve_kernel<T, VEC><<<unsigned(int64_t(p.bs) * p.rsplits), kThreads, 0, stream>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    ws.chunk = chunk_of(ws.splits);
    ws.mode = 0;
    verify_final_kernel<T, VEC>
        <<<unsigned(int64_t(p.bs) * ws.splits), kThreads, 0, stream>>>(p, ws);
    return cudaGetLastError();
  }
  // 2. first final pass over every request
  ws.chunk = chunk_of(ws.splits);
  ws.mode = 1;
  verify_final_kernel<T, VEC><<<unsigned(int64_t(p.bs) * ws.splits), kThreads, 0, stream>>>(p, ws);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  // 3 + 4 fused (sm_90): one cluster per listed request, as large as can be scheduled
  if (TS_LISTED_FUSED && clusters && p.bs <= TS_LISTED_FUSED_MAX_BS) {
    auto kl = verify_listed_kernel<T, VEC>;
    const int cs = max_cluster(kl);  // (sets the non-portable attribute)
    const int cap = cs >= 16 ? cluster_capacity<16>(kl) : cluster_capacity<8>(kl);
    const int64_t nclusters = std::max<int64_t>(1, std::min<int64_t>(p.bs, cap / cs));
    ws.splits = cs;
    ws.chunk = chunk_of(cs);
    ws.mode = 2;
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = launch_config(nclusters * cs, unsigned(cs), stream, attr);
    return cudaLaunchKernelEx(&cfg, kl, p, ws);
  }
  // 3. exact sums, 4. second final pass: listed requests, split as if each were alone
  p.rsplits = pick_splits(1, p.V, res_r, 128, 2048);
  p.rchunk = chunk_of(p.rsplits);
  const int64_t gr = std::min<int64_t>(int64_t(p.bs) * p.rsplits, res_r);
  verify_resolve_kernel<T, VEC><<<unsigned(gr), kThreads, 0, stream>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  ws.splits = pick_splits(1, p.V, res_f, 128, 2048);
  ws.chunk = chunk_of(ws.splits);
  ws.mode = 2;
  const int64_t gf = std::min<int64_t>(int64_t(p.bs) * ws.splits, res_f);
  verify_final_kernel<T, VEC><<<unsigned(gf), kThreads, 0, stream>>>(p, ws);
  return cudaGetLastError();
}
// tw: the radix thresholds' workspace (used when p.thr is set and kBisectThresholds is clear).
template <typename T>
inline cudaError_t launch_verify_probabilistic(VerifyParams p, int sms, bool clusters, FinalWs ws,
                                               const ThrWs& tw, bool vec_ok, cudaStream_t stream) {
  if (p.bs == 0) return cudaSuccess;
  p.cand = ws.cand;
  p.count = ws.count;
  if (ws.splits < 1) ws.splits = verify_final_splits<T>(p.bs, p.V, sms, vec_ok);
  constexpr int VEC = 16 / sizeof(T);
  return vec_ok ? launch_verify_probabilistic_v<T, VEC>(p, sms, clusters, ws, tw, stream)
                : launch_verify_probabilistic_v<T, 1>(p, sms, clusters, ws, tw, stream);
}

inline cudaError_t launch_verify_strict(const StrictParams& p, cudaStream_t stream) {
  if (p.bs == 0) return cudaSuccess;
  const unsigned blocks = unsigned((p.bs + 3) / 4);
  verify_strict_kernel<<<blocks, 128, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace tokenspeed_kernel::verify
