package keyshift

// The C side lives in ksgo.c; every Go file includes ksgo.h.

/*
#cgo pkg-config: keyshift
#cgo CFLAGS: -std=c11 -Wall -Wextra -Werror
#include "ksgo.h"
*/
import "C"
