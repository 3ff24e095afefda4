#pragma once
// <immintrin.h> for the AVX-512 kernel files. GCC 12's AVX-512 intrinsics start several results
// from an "undefined" vector that its own -Wuninitialized then flags (GCC bug 105593, fixed in
// 13); the warnings point into the header, so silencing them around the include hides nothing
// of ours.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
