package main

// The interposed functions are defined in intercept.c, compiled by cgo into
// this package. This file carries only the build flags:
// -Bsymbolic-functions (the cgo allow-list refuses plain -Bsymbolic) binds the
// library's calls to its own functions inside it, so they never come back
// through another preloaded object's interposers.

/*
#cgo CFLAGS: -O2 -Wall -Wno-unused-function -fno-strict-aliasing
#cgo LDFLAGS: -Wl,-Bsymbolic-functions -ldl -lpthread
#include "shim.h"
*/
import "C"
