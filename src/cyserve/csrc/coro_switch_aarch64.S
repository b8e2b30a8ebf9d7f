/* coro_switch_aarch64.S: the coroutine context switch for aarch64 (AAPCS64).
 *
 *   void coro_switch_ctx(void **save_sp, void *load_sp);
 *   void coro_trampoline(void);
 *
 * Same contract as coro_switch_x86_64.S: the callee-saved state is stored on the running stack,
 * the stack pointer goes to *save_sp, then the other context's state is loaded from load_sp.
 * Caller-saved registers (x0-x18, v0-v7, v16-v31, the upper halves of v8-v15) are not saved.
 *
 * Frame at the saved stack pointer (offsets in bytes; 176 bytes, 16-byte aligned):
 *
 *    0  x19    8  x20   16  x21   24  x22   32  x23   40  x24   48  x25   56  x26
 *   64  x27   72  x28   80  x29 (fp)   88  x30 (lr, where the switch returns to)
 *   96  d8   104  d9   112  d10  120  d11  128  d12  136  d13  144  d14  152  d15
 *  160  FPCR  168  padding
 *
 * FPCR (rounding mode, flush-to-zero, trap enables) IS preserved, for the reason given in the
 * x86-64 file for MXCSR: AAPCS64 treats its control fields as preserved across calls, and one
 * coroutine's mode must not leak into another's. FPSR (sticky status flags) is not: it is
 * status, not control, and the ABI does not preserve it either.
 *
 * A fresh frame (built in coro.c) has x19 = the struct coro pointer, x20 = the entry function,
 * x29 = 0 and x30 = coro_trampoline. */

    .text

    .globl coro_switch_ctx
    .hidden coro_switch_ctx
    .type coro_switch_ctx, %function
    .p2align 4
coro_switch_ctx:
    .cfi_startproc
    sub sp, sp, #176
    stp x19, x20, [sp, #0]
    stp x21, x22, [sp, #16]
    stp x23, x24, [sp, #32]
    stp x25, x26, [sp, #48]
    stp x27, x28, [sp, #64]
    stp x29, x30, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mrs x9, fpcr
    str x9, [sp, #160]
    mov x10, sp
    str x10, [x0]
    mov sp, x1
    ldp x19, x20, [sp, #0]
    ldp x21, x22, [sp, #16]
    ldp x23, x24, [sp, #32]
    ldp x25, x26, [sp, #48]
    ldp x27, x28, [sp, #64]
    ldp x29, x30, [sp, #80]
    ldp d8, d9, [sp, #96]
    ldp d10, d11, [sp, #112]
    ldp d12, d13, [sp, #128]
    ldp d14, d15, [sp, #144]
    ldr x9, [sp, #160]
    msr fpcr, x9
    add sp, sp, #176
    ret
    .cfi_endproc
    .size coro_switch_ctx, .-coro_switch_ctx

    .globl coro_trampoline
    .hidden coro_trampoline
    .type coro_trampoline, %function
    .p2align 4
coro_trampoline:
    .cfi_startproc
    .cfi_undefined x30
    mov x0, x19
    blr x20
    /* Not reached: the entry function switches away for good. */
    brk #0
    .cfi_endproc
    .size coro_trampoline, .-coro_trampoline

    .section .note.GNU-stack,"",%progbits
