// 2-D convolution custom ops on oneDNN (CPU), NCHW float32 at the boundary.
//
//   BasebnConvFwd       (x, w, bias)  -> (y)         params: geometry, has_bias
//   BasebnConvBwdData   (dy, w, g)    -> (dx [+ g])  params: geometry, in_h, in_w, has_addend; g (a second gradient
//                                                    of x: a residual block's shortcut) is added in the output pass,
//                                                    a placeholder without has_addend
//   BasebnConvBwdFilter (x, dy)       -> (dw, db)    params: geometry, kernel_h, kernel_w, has_bias
//   BasebnConvBwd   (dy, w, x, g)     -> (dx [+ g], dw, db)  params: geometry, in_h, in_w, has_bias, has_addend:
//                                        both gradients in one call, dy reordered once (g: a placeholder without
//                                        has_addend)
//
// Geometry params: stride_h/w, pad_h/w, dilate_h/w (1 = dense), groups. Weights use MegEngine's
// layout: dense (O, C, kh, kw), grouped (G, O/G, C/G, kh, kw) (a 4-D (O, C/G, kh, kw) is also
// accepted: same memory). dw has the dense or grouped shape by `groups`; db is (O,) and zero
// without has_bias (the bias slot of the forward holds a placeholder then).
// Primitives are created with format_tag::any (oneDNN picks blocked layouts; activations stay NCHW for the
// pointwise convs of plain_layout) and cached per (op, shape, geometry, thread count); user NCHW/oihw tensors are
// reordered to and from those layouts inside each call, through one grow-only arena (also the user-mode
// scratchpad).
// Depthwise convs that conv_depthwise_cpu.h covers (square 3/5/7 kernels, stride 1 or 2, no dilation, planes of at
// least 14 x 14) run there instead, on the NCHW tensors, without reorders ($BASEBN_CONV_DEPTHWISE=0, read once,
// keeps them on oneDNN).
// Threads: the OpenMP runtime of libdnnl; $BASEBN_NUM_THREADS when set, else the OpenMP default.
// Compiled only with -DBASEBN_WITH_DNNL (basebn/ops/kernel_build.py adds it when oneDNN is found).
#ifdef BASEBN_WITH_DNNL

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "conv_depthwise_cpu.h"
#include "dnnl_runtime.h"
#include "megbrain/custom/custom.h"
#include "queued_work.h"

namespace basebn {
namespace dnnl_conv {

using custom::Param;
using custom::Shape;
using custom::Tensor;
using dim = dnnl::memory::dim;
using dims = dnnl::memory::dims;
using tag = dnnl::memory::format_tag;
using dtype = dnnl::memory::data_type;

enum Kind { kFwd = 0, kBwdData = 1, kBwdFilter = 2 };

// Every size of one convolution.
struct Geom {
    dim N, C, H, W, O, KH, KW, SH, SW, PH, PW, DH, DW, G, HO, WO;
    bool bias;
};

dim out_size(dim in, dim k, dim s, dim p, dim d) {
    return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

void read_params(const Param& p, Geom& g) {
    g.SH = p["stride_h"].as<int32_t>();
    g.SW = p["stride_w"].as<int32_t>();
    g.PH = p["pad_h"].as<int32_t>();
    g.PW = p["pad_w"].as<int32_t>();
    g.DH = p["dilate_h"].as<int32_t>();
    g.DW = p["dilate_w"].as<int32_t>();
    g.G = p["groups"].as<int32_t>();
    custom_assert(g.SH > 0 && g.SW > 0 && g.DH > 0 && g.DW > 0 && g.PH >= 0 && g.PW >= 0 && g.G > 0,
                  "conv: bad stride/padding/dilation/groups");
}

// (O, C/G, kh, kw) of a weight shape (dense 4-D, or grouped 5-D with G == groups).
void read_weight(const Shape& w, Geom& g) {
    custom_assert(w.ndim() == 4 || w.ndim() == 5, "conv: weight must be 4-D or 5-D");
    dim cg;
    if (w.ndim() == 5) {
        custom_assert(static_cast<dim>(w[0]) == g.G, "conv: grouped weight has %zu groups, param says %lld",
                      w[0], static_cast<long long>(g.G));
        g.O = static_cast<dim>(w[0] * w[1]);
        cg = static_cast<dim>(w[2]);
    } else {
        g.O = static_cast<dim>(w[0]);
        cg = static_cast<dim>(w[1]);
    }
    g.KH = static_cast<dim>(w[w.ndim() - 2]);
    g.KW = static_cast<dim>(w[w.ndim() - 1]);
    custom_assert(cg * g.G == g.C, "conv: weight has %lld input channels per group, input has %lld channels "
                  "in %lld groups", static_cast<long long>(cg), static_cast<long long>(g.C),
                  static_cast<long long>(g.G));
    custom_assert(g.O % g.G == 0, "conv: output channels not divisible by groups");
}

void check_4d(const Shape& s, const char* what) {
    custom_assert(s.ndim() == 4, "conv: %s must be 4-D (N, C, H, W), got %zu dims", what, s.ndim());
}

// Geometry of an op from its input shapes and params.
Geom geometry(Kind kind, const Shape& a, const Shape& b, const Param& p) {
    Geom g{};
    read_params(p, g);
    g.bias = kind != kBwdData && p["has_bias"].as<bool>();  // (BwdData has no such param)
    if (kind == kFwd) {  // a = x, b = w
        check_4d(a, "x");
        g.N = a[0], g.C = a[1], g.H = a[2], g.W = a[3];
        read_weight(b, g);
        g.HO = out_size(g.H, g.KH, g.SH, g.PH, g.DH);
        g.WO = out_size(g.W, g.KW, g.SW, g.PW, g.DW);
    } else if (kind == kBwdData) {  // a = dy, b = w
        check_4d(a, "dy");
        g.N = a[0], g.HO = a[2], g.WO = a[3];
        g.H = p["in_h"].as<int32_t>(), g.W = p["in_w"].as<int32_t>();
        g.C = (b.ndim() == 5 ? b[2] : b[1]) * g.G;
        read_weight(b, g);
        custom_assert(static_cast<dim>(a[1]) == g.O, "conv: dy has %zu channels, weight %lld", a[1],
                      static_cast<long long>(g.O));
    } else {  // a = x, b = dy
        check_4d(a, "x");
        check_4d(b, "dy");
        g.N = a[0], g.C = a[1], g.H = a[2], g.W = a[3];
        g.O = b[1], g.HO = b[2], g.WO = b[3];
        g.KH = p["kernel_h"].as<int32_t>(), g.KW = p["kernel_w"].as<int32_t>();
        custom_assert(static_cast<dim>(b[0]) == g.N, "conv: x and dy differ in batch size");
        custom_assert(g.C % g.G == 0 && g.O % g.G == 0, "conv: channels not divisible by groups");
    }
    custom_assert(g.HO == out_size(g.H, g.KH, g.SH, g.PH, g.DH) && g.WO == out_size(g.W, g.KW, g.SW, g.PW, g.DW)
                  && g.HO > 0 && g.WO > 0,
                  "conv: output %lldx%lld does not match input %lldx%lld, kernel %lldx%lld",
                  static_cast<long long>(g.HO), static_cast<long long>(g.WO), static_cast<long long>(g.H),
                  static_cast<long long>(g.W), static_cast<long long>(g.KH), static_cast<long long>(g.KW));
    return g;
}

Shape weight_shape(const Geom& g) {
    if (g.G == 1)
        return Shape({size_t(g.O), size_t(g.C), size_t(g.KH), size_t(g.KW)});
    return Shape({size_t(g.G), size_t(g.O / g.G), size_t(g.C / g.G), size_t(g.KH), size_t(g.KW)});
}

// ------------------------------------------------------------------ primitives and their cache
using dnnl_rt::engine;  // (dnnl_runtime.h)

// One user-visible tensor of a call and, when the primitive wants another layout, the reorder
// to (input) or from (output) an arena buffer of that layout.
struct Slot {
    int arg = 0;
    dnnl::memory::desc user, want;
    bool reordered = false;
    dnnl::reorder reorder;
    bool has_reorder_sum = false;  // reorder_sum: the same reorder adding to what the user buffer holds
    dnnl::reorder reorder_sum;
    size_t offset = 0;  // of the internal buffer in the arena
};

struct Entry {
    dnnl::primitive prim;
    std::vector<Slot> ins, outs;
    size_t scratch_offset = 0, arena_bytes = 0;
};

size_t align64(size_t n) {
    return (n + 63) / 64 * 64;
}

Slot make_slot(int arg, const dnnl::memory::desc& user, const dnnl::memory::desc& want, bool is_out,
               size_t& arena) {
    Slot s;
    s.arg = arg;
    s.user = user;
    s.want = want;
    s.reordered = !(user == want);
    if (s.reordered) {
        s.reorder = is_out ? dnnl::reorder(dnnl::reorder::primitive_desc(engine(), want, engine(), user))
                           : dnnl::reorder(dnnl::reorder::primitive_desc(engine(), user, engine(), want));
        s.offset = arena;
        arena += align64(want.get_size());
    }
    return s;
}

// Whether a conv runs on oneDNN's plain-layout kernels (its gemm convolution on the NCHW tensors themselves) rather
// than on blocked ones behind NCHW <-> blocked reorders: pointwise convs (1x1, one group, no padding) over at least
// 14 x 14 input pixels with at most 512 input channels. There the reorders of x, y and dy cost more than the
// blocked kernels save: fwd + bwd 0.49-0.90x the time at 1 thread, 0.51-1.01x at 2; wider or smaller ones run
// slower plain (1024 -> 256 at 14 x 14: 1.17-1.33x; 7 x 7: 0.93-1.72x). $BASEBN_CONV_PLAIN_1X1 (read once): 0
// keeps every conv blocked, "all" sends every such pointwise conv to the NCHW kernels (benchmarks/
// bench_conv_layout.py compares both).
bool plain_layout(const Geom& g) {
    enum Mode { kOff, kRule, kAll };
    static const Mode mode = [] {
        const char* v = std::getenv("BASEBN_CONV_PLAIN_1X1");
        return v == nullptr ? kRule : std::strcmp(v, "0") == 0 ? kOff : std::strcmp(v, "all") == 0 ? kAll : kRule;
    }();
    const bool pointwise = g.KH == 1 && g.KW == 1 && g.G == 1 && g.PH == 0 && g.PW == 0;
    return mode != kOff && pointwise && (mode == kAll || (g.H * g.W >= 14 * 14 && g.C <= 512));
}

std::unique_ptr<Entry> create(Kind kind, const Geom& g) {
    using namespace dnnl;
    const dims xd = {g.N, g.C, g.H, g.W}, yd = {g.N, g.O, g.HO, g.WO}, bd = {g.O};
    const dims wd = g.G == 1 ? dims{g.O, g.C, g.KH, g.KW} : dims{g.G, g.O / g.G, g.C / g.G, g.KH, g.KW};
    const dims st = {g.SH, g.SW}, dl = {g.DH - 1, g.DW - 1}, pl = {g.PH, g.PW};
    const dims pr = {(g.HO - 1) * g.SH + (g.KH - 1) * g.DH + 1 - g.H - g.PH,
                     (g.WO - 1) * g.SW + (g.KW - 1) * g.DW + 1 - g.W - g.PW};
    const memory::desc xu(xd, dtype::f32, tag::nchw), yu(yd, dtype::f32, tag::nchw),
            wu(wd, dtype::f32, g.G == 1 ? tag::oihw : tag::goihw), bu(bd, dtype::f32, tag::a);
    const bool plain = plain_layout(g);
    const memory::desc xa = plain ? xu : memory::desc(xd, dtype::f32, tag::any),
                       ya = plain ? yu : memory::desc(yd, dtype::f32, tag::any),
                       wa(wd, dtype::f32, tag::any), ba(bd, dtype::f32, tag::any);
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    const auto algo = algorithm::convolution_direct;
    auto fpd = g.bias ? convolution_forward::primitive_desc(engine(), prop_kind::forward_training, algo, xa,
                                                            wa, ba, ya, st, dl, pl, pr, attr)
                      : convolution_forward::primitive_desc(engine(), prop_kind::forward_training, algo, xa,
                                                            wa, ya, st, dl, pl, pr, attr);
    auto e = std::make_unique<Entry>();
    size_t arena = 0, scratch = 0;
    if (kind == kFwd) {
        e->prim = convolution_forward(fpd);
        e->ins.push_back(make_slot(DNNL_ARG_SRC, xu, fpd.src_desc(), false, arena));
        e->ins.push_back(make_slot(DNNL_ARG_WEIGHTS, wu, fpd.weights_desc(), false, arena));
        if (g.bias)
            e->ins.push_back(make_slot(DNNL_ARG_BIAS, bu, fpd.bias_desc(), false, arena));
        e->outs.push_back(make_slot(DNNL_ARG_DST, yu, fpd.dst_desc(), true, arena));
        scratch = fpd.scratchpad_desc().get_size();
    } else if (kind == kBwdData) {
        convolution_backward_data::primitive_desc pd(engine(), algo, xa, wa, ya, st, dl, pl, pr, fpd, attr);
        e->prim = convolution_backward_data(pd);
        e->ins.push_back(make_slot(DNNL_ARG_DIFF_DST, yu, pd.diff_dst_desc(), false, arena));
        e->ins.push_back(make_slot(DNNL_ARG_WEIGHTS, wu, pd.weights_desc(), false, arena));
        e->outs.push_back(make_slot(DNNL_ARG_DIFF_SRC, xu, pd.diff_src_desc(), true, arena));
        scratch = pd.scratchpad_desc().get_size();
    } else {
        auto pd = g.bias ? convolution_backward_weights::primitive_desc(engine(), algo, xa, wa, ba, ya, st, dl,
                                                                        pl, pr, fpd, attr)
                         : convolution_backward_weights::primitive_desc(engine(), algo, xa, wa, ya, st, dl, pl,
                                                                        pr, fpd, attr);
        e->prim = convolution_backward_weights(pd);
        e->ins.push_back(make_slot(DNNL_ARG_SRC, xu, pd.src_desc(), false, arena));
        e->ins.push_back(make_slot(DNNL_ARG_DIFF_DST, yu, pd.diff_dst_desc(), false, arena));
        e->outs.push_back(make_slot(DNNL_ARG_DIFF_WEIGHTS, wu, pd.diff_weights_desc(), true, arena));
        if (g.bias)
            e->outs.push_back(make_slot(DNNL_ARG_DIFF_BIAS, bu, pd.diff_bias_desc(), true, arena));
        scratch = pd.scratchpad_desc().get_size();
    }
    e->scratch_offset = arena;
    e->arena_bytes = arena + align64(scratch) + 64;
    return e;
}

// Grow-only 64-byte aligned buffer shared by all calls (they run one at a time under g_mutex).
struct Arena {
    void* ptr = nullptr;
    size_t bytes = 0;
    char* get(size_t n) {
        if (n > bytes) {
            std::free(ptr);
            ptr = nullptr;
            bytes = 0;
            custom_assert(posix_memalign(&ptr, 64, n) == 0, "conv: cannot allocate %zu bytes", n);
            bytes = n;
        }
        return static_cast<char*>(ptr);
    }
};

std::mutex g_mutex;
std::map<std::vector<dim>, std::unique_ptr<Entry>> g_cache;
Arena g_arena;

using dnnl_rt::set_threads;  // $BASEBN_NUM_THREADS, else the OpenMP default (dnnl_runtime.h)

Entry& entry(Kind kind, const Geom& g, int threads) {
    const std::vector<dim> key = {kind, g.N, g.C, g.H, g.W, g.O, g.KH, g.KW, g.SH, g.SW, g.PH, g.PW,
                                  g.DH, g.DW, g.G, g.HO, g.WO, g.bias, threads};
    auto it = g_cache.find(key);
    if (it == g_cache.end())
        it = g_cache.emplace(key, create(kind, g)).first;
    return *it->second;
}

const float* contiguous(const Tensor& t, std::vector<float>& buf) {
    return dnnl_rt::contiguous_f32(t, buf, "conv");
}

float* out_ptr(Tensor& t) {
    custom_assert(t.is_contiguous() || t.size() == 0, "conv: output tensor is not contiguous");
    return t.data<float>();
}

// dst[i] = src[i] (add false) or dst[i] += src[i] (add true), i < n, on `threads` OpenMP threads.
void copy_or_add(float* dst, const float* src, size_t n, int threads, bool add) {
    const int64_t chunk = 1 << 14, chunks = static_cast<int64_t>((n + chunk - 1) / chunk);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
        const size_t b = static_cast<size_t>(c * chunk), e = std::min(n, b + static_cast<size_t>(chunk));
        if (add) {
#pragma omp simd
            for (size_t i = b; i < e; ++i) {
                dst[i] += src[i];
            }
        } else {
            std::memcpy(dst + b, src + b, (e - b) * sizeof(float));
        }
    }
}

// The channel block of a dense nChw{8,16}c layout (oneDNN's aBcd8b / aBcd16b), else 0.
dim channel_block(const dnnl::memory::desc& d) {
    if (d.get_ndims() != 4 || d.get_format_kind() != dnnl::memory::format_kind::blocked || d.get_inner_nblks() != 1 ||
        d.get_inner_idxs()[0] != 1)
        return 0;
    const dim b = d.get_inner_blks()[0];
    const dims pd = d.get_padded_dims(), st = d.get_strides();
    if ((b != 8 && b != 16) || st[3] != b || st[2] != pd[3] * b || st[1] != pd[2] * pd[3] * b ||
        st[0] != pd[1] * pd[2] * pd[3])
        return 0;
    return b;
}

// out (NCHW) = in (nChw{b}c, C padded to a multiple of b) + addend (NCHW): the reorder and the add in one pass.
void unblock_adding(const float* in, float* out, const float* addend, dim N, dim C, dim HW, dim b, int threads) {
    const dim blocks = (C + b - 1) / b;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (dim nb = 0; nb < N * blocks; ++nb) {
        const dim n = nb / blocks, c0 = (nb % blocks) * b;
        const float* src = in + nb * HW * b;
        for (dim k = 0; k < b && c0 + k < C; ++k) {
            const size_t row = static_cast<size_t>((n * C + c0 + k) * HW);
            float* dst = out + row;
            const float* add = addend + row;
#pragma omp simd
            for (dim s = 0; s < HW; ++s) {
                dst[s] = src[s * b + k] + add[s];
            }
        }
    }
}

// Write `internal` (the primitive's layout) to `user` (NCHW) plus `addend` (NCHW, as many elements): one pass for
// nChw8c / nChw16c; otherwise `user` := addend, then the slot's reorder with a sum post-op (dst = reorder(src) + dst).
void reorder_adding(Slot& s, dnnl::stream& strm, dnnl::memory& internal, dnnl::memory& user, const float* addend,
                    int threads) {
    const dim b = channel_block(s.want);
    if (b != 0 && s.user.get_ndims() == 4) {
        const dims d = s.user.get_dims();
        unblock_adding(static_cast<const float*>(internal.get_data_handle()),
                       static_cast<float*>(user.get_data_handle()), addend, d[0], d[1], d[2] * d[3], b, threads);
        return;
    }
    if (!s.has_reorder_sum) {
        dnnl::post_ops po;
        po.append_sum(1.f);
        dnnl::primitive_attr attr;
        attr.set_post_ops(po);
        s.reorder_sum = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), s.want, engine(), s.user, attr));
        s.has_reorder_sum = true;
    }
    copy_or_add(static_cast<float*>(user.get_data_handle()), addend, s.user.get_size() / sizeof(float), threads,
                false);
    s.reorder_sum.execute(strm, internal, user);
}

// Run entry `e` in `arena` (e.arena_bytes long): `ins` / `outs` are user (NCHW / oihw / (O,)) pointers in the entry's
// slot order; `addend` (or null): NCHW values added to the first output in the pass that writes it; `given` (or
// null): input slot `given_slot` already in its wanted layout (not reordered again). Returns the memory the
// primitive read for each input slot.
std::vector<dnnl::memory> run_entry(Entry& e, char* arena, dnnl::stream& strm, const std::vector<const float*>& ins,
                                    const std::vector<float*>& outs, const float* addend, int threads,
                                    const dnnl::memory* given = nullptr, size_t given_slot = 0) {
    std::unordered_map<int, dnnl::memory> args;
    std::vector<dnnl::memory> read;
    for (size_t i = 0; i < e.ins.size(); ++i) {
        const Slot& s = e.ins[i];
        dnnl::memory user(s.user, engine(), const_cast<float*>(ins[i]));
        if (given != nullptr && i == given_slot) {
            read.push_back(*given);
        } else if (s.reordered) {
            dnnl::memory internal(s.want, engine(), arena + s.offset);
            s.reorder.execute(strm, user, internal);
            read.push_back(internal);
        } else {
            read.push_back(user);
        }
        args.emplace(s.arg, read.back());
    }
    std::vector<std::pair<dnnl::memory, dnnl::memory>> back;  // (internal, user) outputs
    for (size_t i = 0; i < e.outs.size(); ++i) {
        const Slot& s = e.outs[i];
        dnnl::memory user(s.user, engine(), outs[i]);
        if (s.reordered) {
            dnnl::memory internal(s.want, engine(), arena + s.offset);
            args.emplace(s.arg, internal);
            back.emplace_back(internal, user);
        } else {
            args.emplace(s.arg, user);
        }
    }
    const dnnl::memory::desc scratch_desc({static_cast<dim>(e.arena_bytes - e.scratch_offset)}, dtype::u8, tag::a);
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(scratch_desc, engine(), arena + e.scratch_offset));
    e.prim.execute(strm, args);
    if (addend != nullptr)
        strm.wait();  // the add below reads the primitive's result outside the stream
    size_t k = 0;
    for (size_t i = 0; i < e.outs.size(); ++i) {
        Slot& s = e.outs[i];
        const float* add = i == 0 ? addend : nullptr;
        if (s.reordered) {
            if (add != nullptr) {
                reorder_adding(s, strm, back[k].first, back[k].second, add, threads);
            } else {
                s.reorder.execute(strm, back[k].first, back[k].second);
            }
            ++k;
        } else if (add != nullptr) {
            copy_or_add(outs[i], add, s.user.get_size() / sizeof(float), threads, true);
        }
    }
    strm.wait();
    return read;
}

// Run one op (see run_entry).
void execute(Kind kind, const Geom& g, const std::vector<const float*>& ins, const std::vector<float*>& outs,
             const float* addend = nullptr) {
    std::lock_guard<std::mutex> lock(g_mutex);
    const int threads = set_threads();
    Entry& e = entry(kind, g, threads);
    dnnl::stream strm(engine());
    run_entry(e, g_arena.get(e.arena_bytes), strm, ins, outs, addend, threads);
}

// Both gradients of one conv: the data gradient (geometry gd; plus `addend` when not null) into dx, then the weight
// gradient (gf) into dw (and db), the second reading dy in the layout the first reordered it to when both want
// the same (dy reordered once). The two entries get disjoint parts of the arena.
void execute_backward(const Geom& gd, const Geom& gf, const float* dy, const float* w, const float* x, float* dx,
                      float* dw, float* db, const float* addend) {
    std::lock_guard<std::mutex> lock(g_mutex);
    const int threads = set_threads();
    Entry& ed = entry(kBwdData, gd, threads);
    Entry& ef = entry(kBwdFilter, gf, threads);
    char* arena = g_arena.get(ed.arena_bytes + ef.arena_bytes);
    dnnl::stream strm(engine());
    const std::vector<dnnl::memory> read = run_entry(ed, arena, strm, {dy, w}, {dx}, addend, threads);
    const bool share = ed.ins[0].want == ef.ins[1].want;  // bwd-data slot 0 and bwd-filter slot 1: dy
    std::vector<float*> outs = {dw};
    if (gf.bias)
        outs.push_back(db);
    run_entry(ef, arena + ed.arena_bytes, strm, {x, dy}, outs, nullptr, threads, share ? &read[0] : nullptr, 1);
}

template <class F>
void guarded(F&& f) {
    try {
        f();
    } catch (const dnnl::error& err) {
        custom_assert(false, "oneDNN error in basebn conv: %s (status %d)", err.what(), static_cast<int>(err.status));
    }
}

// ------------------------------------------------------------------ depthwise convs off oneDNN
// Whether the conv is depthwise (one input and one output channel per group) in a shape conv_depthwise_cpu.h takes.
bool direct_depthwise(const Geom& g) {
    static const bool enabled = [] {
        const char* v = std::getenv("BASEBN_CONV_DEPTHWISE");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    return enabled && g.G > 1 && g.G == g.C && g.O == g.C &&
           depthwise::supported(g.KH, g.KW, g.SH, g.SW, g.PH, g.PW, g.DH, g.DW, g.H, g.W);
}

depthwise::Geom depthwise_geom(const Geom& g) {
    return {g.N, g.C, g.H, g.W, g.KH, g.SH, g.PH, g.HO, g.WO};
}

// ------------------------------------------------------------------ computes
void fwd_compute(const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {
    wait_for_queued_work();
    const Geom g = geometry(kFwd, in[0].shape(), in[1].shape(), p);
    if (out[0].size() == 0)
        return;
    std::vector<float> bx, bw, bb;
    std::vector<const float*> ins = {contiguous(in[0], bx), contiguous(in[1], bw)};
    if (g.bias) {
        custom_assert(static_cast<dim>(in[2].size()) == g.O, "conv: bias has %zu elements, expected %lld",
                      in[2].size(), static_cast<long long>(g.O));
        ins.push_back(contiguous(in[2], bb));
    }
    if (direct_depthwise(g))
        return depthwise::forward(ins[0], ins[1], g.bias ? ins[2] : nullptr, out_ptr(out[0]), depthwise_geom(g),
                                  set_threads());
    guarded([&]() { execute(kFwd, g, ins, {out_ptr(out[0])}); });
}

// `a`, the shape of input `what` (the added gradient, or x), must be dx's (N, C, H, W) under geometry `g`.
void check_like_dx(const Shape& a, const Geom& g, const char* what) {
    custom_assert(a.ndim() == 4 && static_cast<dim>(a[0]) == g.N && static_cast<dim>(a[1]) == g.C &&
                  static_cast<dim>(a[2]) == g.H && static_cast<dim>(a[3]) == g.W,
                  "conv: %s must have dx's shape (%lld, %lld, %lld, %lld)", what,
                  static_cast<long long>(g.N), static_cast<long long>(g.C), static_cast<long long>(g.H),
                  static_cast<long long>(g.W));
}

void bwd_data_compute(const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {
    wait_for_queued_work();
    const Geom g = geometry(kBwdData, in[0].shape(), in[1].shape(), p);
    const bool has_addend = p["has_addend"].as<bool>();
    if (has_addend)
        check_like_dx(in[2].shape(), g, "the added gradient");
    if (out[0].size() == 0)
        return;
    std::vector<float> bdy, bw, badd;
    const std::vector<const float*> ins = {contiguous(in[0], bdy), contiguous(in[1], bw)};
    const float* addend = has_addend ? contiguous(in[2], badd) : nullptr;
    if (direct_depthwise(g))
        return depthwise::backward_data(ins[0], ins[1], addend, out_ptr(out[0]), depthwise_geom(g), set_threads());
    guarded([&]() { execute(kBwdData, g, ins, {out_ptr(out[0])}, addend); });
}

// BasebnConvBwd: (dy, w, x, g) -> (dx [+ g], dw, db).
void bwd_compute(const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {
    wait_for_queued_work();
    const Geom gd = geometry(kBwdData, in[0].shape(), in[1].shape(), p);
    Geom gf = gd;
    gf.bias = p["has_bias"].as<bool>();
    check_like_dx(in[2].shape(), gd, "x");
    const bool has_addend = p["has_addend"].as<bool>();
    if (has_addend)
        check_like_dx(in[3].shape(), gd, "the added gradient");
    float* dw = out_ptr(out[1]);
    float* db = out_ptr(out[2]);
    if (!gf.bias || out[0].size() == 0)
        std::fill(db, db + out[2].size(), 0.f);
    if (out[0].size() == 0) {
        std::fill(dw, dw + out[1].size(), 0.f);
        return;
    }
    std::vector<float> bdy, bw, bx, badd;
    const float* addend = has_addend ? contiguous(in[3], badd) : nullptr;
    const float *dy = contiguous(in[0], bdy), *w = contiguous(in[1], bw), *x = contiguous(in[2], bx);
    if (direct_depthwise(gd)) {
        const int threads = set_threads();
        depthwise::backward_data(dy, w, addend, out_ptr(out[0]), depthwise_geom(gd), threads);
        return depthwise::backward_weights(x, dy, dw, gf.bias ? db : nullptr, depthwise_geom(gf), threads);
    }
    guarded([&]() { execute_backward(gd, gf, dy, w, x, out_ptr(out[0]), dw, db, addend); });
}

void bwd_filter_compute(const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {
    wait_for_queued_work();
    const Geom g = geometry(kBwdFilter, in[0].shape(), in[1].shape(), p);
    float* dw = out_ptr(out[0]);
    float* db = out_ptr(out[1]);
    if (!g.bias || g.N == 0)
        std::fill(db, db + out[1].size(), 0.f);
    if (g.N == 0) {
        std::fill(dw, dw + out[0].size(), 0.f);
        return;
    }
    std::vector<float> bx, bdy;
    const std::vector<const float*> ins = {contiguous(in[0], bx), contiguous(in[1], bdy)};
    if (direct_depthwise(g))
        return depthwise::backward_weights(ins[0], ins[1], dw, g.bias ? db : nullptr, depthwise_geom(g),
                                           set_threads());
    std::vector<float*> outs = {dw};
    if (g.bias)
        outs.push_back(db);
    guarded([&]() { execute(kBwdFilter, g, ins, outs); });
}

// ------------------------------------------------------------------ inference
void fwd_shape(const std::vector<Shape>& in, const Param& p, std::vector<Shape>& out) {
    const Geom g = geometry(kFwd, in[0], in[1], p);
    out[0] = Shape({size_t(g.N), size_t(g.O), size_t(g.HO), size_t(g.WO)});
}

void bwd_data_shape(const std::vector<Shape>& in, const Param& p, std::vector<Shape>& out) {
    const Geom g = geometry(kBwdData, in[0], in[1], p);
    out[0] = Shape({size_t(g.N), size_t(g.C), size_t(g.H), size_t(g.W)});
}

void bwd_shape(const std::vector<Shape>& in, const Param& p, std::vector<Shape>& out) {
    const Geom g = geometry(kBwdData, in[0], in[1], p);
    out[0] = Shape({size_t(g.N), size_t(g.C), size_t(g.H), size_t(g.W)});
    out[1] = weight_shape(g);
    out[2] = Shape({size_t(g.O)});
}

void bwd_filter_shape(const std::vector<Shape>& in, const Param& p, std::vector<Shape>& out) {
    const Geom g = geometry(kBwdFilter, in[0], in[1], p);
    out[0] = weight_shape(g);
    out[1] = Shape({size_t(g.O)});
}

}  // namespace dnnl_conv
}  // namespace basebn

CUSTOM_OP_REG_BEGIN(BasebnConv)

using namespace basebn::dnnl_conv;

#define BASEBN_CONV_GEOMETRY_PARAMS                                                            \
    .add_param("stride_h", 1).add_param("stride_w", 1).add_param("pad_h", 0).add_param("pad_w", 0) \
            .add_param("dilate_h", 1).add_param("dilate_w", 1).add_param("groups", 1)

CUSTOM_OP_REG(BasebnConvFwd)
        .set_description("basebn: oneDNN 2-D convolution forward, y = conv(x, w) + bias")
        .add_input("x", {"float32"})
        .add_input("w", {"float32"})
        .add_input("bias", {"float32"})
        .add_output("y", {"float32"}) BASEBN_CONV_GEOMETRY_PARAMS
        .add_param("has_bias", false)
        .set_device_infer(basebn::dnnl_rt::same_device)
        .set_format_infer(basebn::dnnl_rt::same_format)
        .set_shape_infer(fwd_shape)
        .set_dtype_infer(basebn::dnnl_rt::float_dtype)
        .set_compute("x86", fwd_compute);

CUSTOM_OP_REG(BasebnConvBwdData)
        .set_description("basebn: oneDNN 2-D convolution data gradient dx from (dy, w), plus g with has_addend")
        .add_input("dy", {"float32"})
        .add_input("w", {"float32"})
        .add_input("g", {"float32"})
        .add_output("dx", {"float32"}) BASEBN_CONV_GEOMETRY_PARAMS
        .add_param("in_h", 1)
        .add_param("in_w", 1)
        .add_param("has_addend", false)
        .set_device_infer(basebn::dnnl_rt::same_device)
        .set_format_infer(basebn::dnnl_rt::same_format)
        .set_shape_infer(bwd_data_shape)
        .set_dtype_infer(basebn::dnnl_rt::float_dtype)
        .set_compute("x86", bwd_data_compute);

CUSTOM_OP_REG(BasebnConvBwd)
        .set_description("basebn: oneDNN 2-D convolution gradients in one call: dx (+ g), dw, db; dy reordered once")
        .add_input("dy", {"float32"})
        .add_input("w", {"float32"})
        .add_input("x", {"float32"})
        .add_input("g", {"float32"})
        .add_output("dx", {"float32"})
        .add_output("dw", {"float32"})
        .add_output("db", {"float32"}) BASEBN_CONV_GEOMETRY_PARAMS
        .add_param("in_h", 1)
        .add_param("in_w", 1)
        .add_param("has_bias", false)
        .add_param("has_addend", false)
        .set_device_infer(basebn::dnnl_rt::same_device)
        .set_format_infer(basebn::dnnl_rt::same_format)
        .set_shape_infer(bwd_shape)
        .set_dtype_infer(basebn::dnnl_rt::float_dtype)
        .set_compute("x86", bwd_compute);

CUSTOM_OP_REG(BasebnConvBwdFilter)
        .set_description("basebn: oneDNN 2-D convolution weight (and bias) gradient from (x, dy)")
        .add_input("x", {"float32"})
        .add_input("dy", {"float32"})
        .add_output("dw", {"float32"})
        .add_output("db", {"float32"}) BASEBN_CONV_GEOMETRY_PARAMS
        .add_param("kernel_h", 1)
        .add_param("kernel_w", 1)
        .add_param("has_bias", false)
        .set_device_infer(basebn::dnnl_rt::same_device)
        .set_format_infer(basebn::dnnl_rt::same_format)
        .set_shape_infer(bwd_filter_shape)
        .set_dtype_infer(basebn::dnnl_rt::float_dtype)
        .set_compute("x86", bwd_filter_compute);

#undef BASEBN_CONV_GEOMETRY_PARAMS

CUSTOM_OP_REG_END(BasebnConv)

#endif  // BASEBN_WITH_DNNL
