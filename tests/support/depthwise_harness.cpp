// Runs basebn/ops/csrc/conv_depthwise_cpu.h's three ops on raw float32 files, for tests/ops/test_conv_dnnl.py
// (built there with and without -DBASEBN_DEPTHWISE_PORTABLE). Usage:
//   depthwise_harness N C H W K S P DIR   reads DIR/{x,w,b,dy,add}.f32, writes DIR/{y,dx,dw,db}.f32
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "conv_depthwise_cpu.h"

using basebn::depthwise::dim;

static std::vector<float> load(const std::string& path, size_t n) {
    std::vector<float> v(n);
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr || std::fread(v.data(), sizeof(float), n, f) != n)
        std::exit(3);
    std::fclose(f);
    return v;
}

static void save(const std::string& path, const std::vector<float>& v) {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(v.data(), sizeof(float), v.size(), f) != v.size())
        std::exit(4);
    std::fclose(f);
}

int main(int argc, char** argv) {
    if (argc != 9)
        return 2;
    basebn::depthwise::Geom g{};
    g.N = std::atol(argv[1]), g.C = std::atol(argv[2]), g.H = std::atol(argv[3]), g.W = std::atol(argv[4]);
    g.K = std::atol(argv[5]), g.S = std::atol(argv[6]), g.P = std::atol(argv[7]);
    g.HO = (g.H + 2 * g.P - g.K) / g.S + 1, g.WO = (g.W + 2 * g.P - g.K) / g.S + 1;
    const std::string dir = argv[8];
    const size_t nx = g.N * g.C * g.H * g.W, ny = g.N * g.C * g.HO * g.WO, nw = g.C * g.K * g.K;
    const auto x = load(dir + "/x.f32", nx), w = load(dir + "/w.f32", nw), b = load(dir + "/b.f32", g.C);
    const auto dy = load(dir + "/dy.f32", ny), add = load(dir + "/add.f32", nx);
    std::vector<float> y(ny), dx(nx), dw(nw), db(g.C);
    basebn::depthwise::forward(x.data(), w.data(), b.data(), y.data(), g, 2);
    basebn::depthwise::backward_data(dy.data(), w.data(), add.data(), dx.data(), g, 2);
    basebn::depthwise::backward_weights(x.data(), dy.data(), dw.data(), db.data(), g, 2);
    save(dir + "/y.f32", y);
    save(dir + "/dx.f32", dx);
    save(dir + "/dw.f32", dw);
    save(dir + "/db.f32", db);
    return 0;
}
