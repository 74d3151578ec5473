// Host memory copies (host_copy.hpp).
#include "host_copy.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ge {

#if defined(__x86_64__)
// Copies n bytes (a multiple of 128) to a 32-byte aligned d with streaming stores, then fences them.
__attribute__((target("avx2"))) static void stream_avx2(char *d, const char *s, size_t n) {
  for (size_t i = 0; i < n; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + i + 64));
    __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i *>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i *>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i *>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i *>(d + i + 96), e);
  }
  _mm_sfence();
}

static bool has_avx2() {
  static const bool yes = (__builtin_cpu_init(), __builtin_cpu_supports("avx2"));
  return yes;
}
#endif

void copy_streaming(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
  constexpr size_t kMin = 4096;  // below a page, streaming's fence costs more than it saves
  if (n >= kMin && has_avx2()) {
    char *d = static_cast<char *>(dst);
    const char *s = static_cast<const char *>(src);
    size_t head = (32 - reinterpret_cast<uintptr_t>(d) % 32) % 32;
    std::memcpy(d, s, head);
    size_t body = (n - head) & ~size_t(127);
    stream_avx2(d + head, s + head, body);
    std::memcpy(d + head + body, s + head + body, n - head - body);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace ge
