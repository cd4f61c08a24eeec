//go:build amd64 && !race

#include "textflag.h"

// func Kept64(addr *uint64, v uint64)
TEXT ·Kept64(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ addr+0(FP), AX
	MOVQ v+8(FP), BX
	MOVQ BX, (AX)
	RET
