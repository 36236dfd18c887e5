// Runs basebn/ops/csrc/strided_rows.h's gather on a raw float32 file, for tests/ops/test_strided_gather.py.
// Usage:
//   gather_harness SRC OUT N ND SHAPE... STRIDE...   reads SRC (float32), writes the N gathered values to OUT
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "strided_rows.h"

int main(int argc, char** argv) {
    if (argc < 5)
        return 2;
    const long long n = std::atoll(argv[3]);
    const int nd = std::atoi(argv[4]);
    if (nd < 0 || nd > basebn::strided::kMaxDims || argc != 5 + 2 * nd)
        return 2;
    std::vector<int64_t> shape(nd), stride(nd);
    for (int d = 0; d < nd; ++d) {
        shape[d] = std::atoll(argv[5 + d]);
        stride[d] = std::atoll(argv[5 + nd + d]);
    }
    std::vector<float> src;
    FILE* f = std::fopen(argv[1], "rb");
    if (f == nullptr)
        return 3;
    float v;
    while (std::fread(&v, sizeof(float), 1, f) == 1)
        src.push_back(v);
    std::fclose(f);
    std::vector<float> out(static_cast<size_t>(n));
    basebn::strided::gather(src.data(), shape.data(), stride.data(), nd, n, out.data());
    f = std::fopen(argv[2], "wb");
    if (f == nullptr || std::fwrite(out.data(), sizeof(float), out.size(), f) != out.size())
        return 4;
    std::fclose(f);
    return 0;
}
