#include "textflag.h"

// func copyNT(dst, src unsafe.Pointer, n int)
// n is a multiple of 8.
TEXT ·copyNT(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	// A destination not 8-byte aligned never reaches 16-byte alignment by
	// words: it goes by words throughout.
	TESTQ $7, DI
	JNZ words
	// One word first when the destination is 8 but not 16 aligned.
	TESTQ $8, DI
	JZ aligned
	CMPQ CX, $8
	JB done
	MOVQ (SI), AX
	MOVNTIQ AX, (DI)
	ADDQ $8, SI
	ADDQ $8, DI
	SUBQ $8, CX
aligned:
	CMPQ CX, $64
	JB words
big:
	MOVOU (SI), X0
	MOVOU 16(SI), X1
	MOVOU 32(SI), X2
	MOVOU 48(SI), X3
	MOVNTO X0, (DI)
	MOVNTO X1, 16(DI)
	MOVNTO X2, 32(DI)
	MOVNTO X3, 48(DI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $64, CX
	CMPQ CX, $64
	JAE big
words:
	CMPQ CX, $8
	JB done
	MOVQ (SI), AX
	MOVNTIQ AX, (DI)
	ADDQ $8, SI
	ADDQ $8, DI
	SUBQ $8, CX
	JMP words
done:
	RET

// func gatherNT(dst, src unsafe.Pointer, stride, n int)
// n > 0.
TEXT ·gatherNT(SB), NOSPLIT|NOFRAME, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ stride+16(FP), DX
	MOVQ n+24(FP), CX
	MOVQ CX, BX
	SHRQ $2, CX
	JZ one
four:
	MOVQ (SI), AX
	ADDQ DX, SI
	MOVQ (SI), R8
	ADDQ DX, SI
	MOVQ (SI), R9
	ADDQ DX, SI
	MOVQ (SI), R10
	ADDQ DX, SI
	MOVNTIQ AX, (DI)
	MOVNTIQ R8, 8(DI)
	MOVNTIQ R9, 16(DI)
	MOVNTIQ R10, 24(DI)
	ADDQ $32, DI
	DECQ CX
	JNZ four
one:
	ANDQ $3, BX
	JZ gdone
oneloop:
	MOVQ (SI), AX
	ADDQ DX, SI
	MOVNTIQ AX, (DI)
	ADDQ $8, DI
	DECQ BX
	JNZ oneloop
gdone:
	RET

// func StoreFence()
TEXT ·StoreFence(SB), NOSPLIT|NOFRAME, $0-0
	SFENCE
	RET
