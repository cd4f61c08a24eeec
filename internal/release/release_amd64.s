//go:build amd64 && !race

#include "textflag.h"

// func Store64(addr *uint64, v uint64)
TEXT ·Store64(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ addr+0(FP), AX
	MOVQ v+8(FP), BX
	MOVQ BX, (AX)
	RET

// func Store32(addr *uint32, v uint32)
TEXT ·Store32(SB), NOSPLIT|NOFRAME, $0-12
	MOVQ addr+0(FP), AX
	MOVL v+8(FP), BX
	MOVL BX, (AX)
	RET
