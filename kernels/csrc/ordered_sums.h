// Included by a kernel whose float sums are ordered by hand, after its other includes. The
// build's -fassociative-math would let the compiler reorder the plain-C++ path's sums
// differently per tile shape, and a row's bits would then depend on the tile it ran in; so not
// in the functions that follow.
#pragma once

#if defined(__clang__)
#pragma clang fp reassociate(off)
#elif defined(__GNUC__)
#pragma GCC optimize("no-associative-math")
#endif
