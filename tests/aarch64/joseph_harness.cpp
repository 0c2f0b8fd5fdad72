// Runs one Joseph kernel call of a prebuilt library (dlopen) on inputs written by
// tests/test_aarch64_kernels.py and writes the result, so the aarch64 build can be
// checked under qemu-user against the reference backend computed on the host.
//
//   joseph_harness LIB.so IN.bin OUT.bin
//
// IN.bin: "CTBH", 17 int32 (real bytes, op 0=forward 1=backward 2=geometry VJP, batch, D, H, W, z0, z1,
// cone, n_views, U, V, u0, u1, v0, v1, nthreads), 3 float64 (dx, dy, dz), then in the
// real type: source, centre, ustep, vstep (n_views x 3 each) and the input array
// (forward: batch x (z1-z0) x H x W volume slab; backward: batch x n_views x (u1-u0) x (v1-v0);
// geometry VJP (a joseph_grad library): the volume slab, then the sinogram cotangent; its output is
// n_views x 12 float64; 3=FDK weighted backprojection (an fdk library): u0, u1 hold the view
// range k0, k1; the inputs are view weights (n_views) and the filtered projections stored with u
// fastest (n_views x V x U); the output is the (z1-z0) x H x W slab).
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

typedef long long i64;

bool read_all(FILE* f, void* p, size_t n) { return std::fread(p, 1, n, f) == n; }

template <typename real>
int run(void* lib, const int32_t* h, const double* d, FILE* in, FILE* out) {
  const int op = h[1], batch = h[2], D = h[3], H = h[4], W = h[5], z0 = h[6], z1 = h[7], cone = h[8];
  const int nv = h[9], U = h[10], V = h[11], u0 = h[12], u1 = h[13], v0 = h[14], v1 = h[15], nthreads = h[16];
  const char* suffix = sizeof(real) == 4 ? "_f32" : "_f64";
  std::vector<real> geo(size_t(nv) * 12);
  if (!read_all(in, geo.data(), geo.size() * sizeof(real))) return 3;
  const real* src = geo.data();
  const real* ctr = src + 3 * nv;
  const real* us = ctr + 3 * nv;
  const real* vs = us + 3 * nv;
  const size_t nvol = size_t(batch) * (z1 - z0) * H * W;
  const size_t nsino = size_t(batch) * nv * (u1 - u0) * (v1 - v0);
  if (op == 3) {
    std::vector<real> w(nv), q(size_t(nv) * U * V), o(size_t(z1 - z0) * H * W, real(0));
    if (!read_all(in, w.data(), w.size() * sizeof(real)) || !read_all(in, q.data(), q.size() * sizeof(real))) return 3;
    void* fn = dlsym(lib, (std::string("fdk_backproject") + suffix).c_str());
    if (!fn) return 4;
    typedef void (*F)(const real*, i64, i64, i64, int, int, const real*, const real*, const real*, const real*,
                      const real*, int, int, int, int, int, int, int, int, double, double, double, real*, int, int);
    reinterpret_cast<F>(fn)(q.data(), i64(U) * V, 1, U, U, V, src, ctr, us, vs, w.data(), cone, u0, u1, D, H, W, z0,
                            z1, d[0], d[1], d[2], o.data(), 0, nthreads);
    return std::fwrite(o.data(), sizeof(real), o.size(), out) == o.size() ? 0 : 5;
  }
  std::vector<real> a(op == 1 ? nsino : nvol), b(op == 0 ? nsino : nvol, real(0));
  if (!read_all(in, a.data(), a.size() * sizeof(real))) return 3;
  std::vector<real> cot(op == 2 ? nsino : 0);
  std::vector<double> vjp(op == 2 ? size_t(nv) * 12 : 0);
  if (op == 2 && !read_all(in, cot.data(), cot.size() * sizeof(real))) return 3;
  const char* names[] = {"joseph_forward", "joseph_backward", "joseph_geometry_vjp"};
  if (op < 0 || op > 2) return 3;
  std::string name = std::string(names[op]) + suffix;
  void* fn = dlsym(lib, name.c_str());
  if (!fn) {
    std::fprintf(stderr, "no symbol %s\n", name.c_str());
    return 4;
  }
  if (op == 0) {
    typedef void (*F)(const real*, i64, int, int, int, int, int, int, double, double, double, const real*,
                      const real*, const real*, const real*, int, int, int, int, int, int, int, int, real*, int, int);
    reinterpret_cast<F>(fn)(a.data(), i64(z1 - z0) * H * W, batch, D, H, W, z0, z1, d[0], d[1], d[2], src, ctr, us,
                            vs, cone, nv, U, V, u0, u1, v0, v1, b.data(), 0, nthreads);
  } else if (op == 2) {
    typedef void (*F)(const real*, i64, int, int, int, int, int, int, double, double, double, const real*,
                      const real*, const real*, const real*, int, int, int, int, int, int, int, int, const real*,
                      double*, int);
    reinterpret_cast<F>(fn)(a.data(), i64(z1 - z0) * H * W, batch, D, H, W, z0, z1, d[0], d[1], d[2], src, ctr, us,
                            vs, cone, nv, U, V, u0, u1, v0, v1, cot.data(), vjp.data(), nthreads);
    return std::fwrite(vjp.data(), sizeof(double), vjp.size(), out) == vjp.size() ? 0 : 5;
  } else {
    typedef void (*F)(const real*, int, int, int, int, int, int, double, double, double, const real*, const real*,
                      const real*, const real*, int, int, int, int, int, int, int, int, real*, i64, int);
    reinterpret_cast<F>(fn)(a.data(), batch, D, H, W, z0, z1, d[0], d[1], d[2], src, ctr, us, vs, cone, nv, U, V, u0,
                            u1, v0, v1, b.data(), i64(z1 - z0) * H * W, nthreads);
  }
  return std::fwrite(b.data(), sizeof(real), b.size(), out) == b.size() ? 0 : 5;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s LIB IN OUT\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  FILE* in = std::fopen(argv[2], "rb");
  FILE* out = std::fopen(argv[3], "wb");
  if (!in || !out) return 2;
  char magic[4];
  int32_t h[17];
  double d[3];
  if (!read_all(in, magic, 4) || std::memcmp(magic, "CTBH", 4) != 0 || !read_all(in, h, sizeof h) ||
      !read_all(in, d, sizeof d))
    return 3;
  const int rc = h[0] == 4 ? run<float>(lib, h, d, in, out) : run<double>(lib, h, d, in, out);
  std::fclose(in);
  return std::fclose(out) == 0 ? rc : 5;
}
