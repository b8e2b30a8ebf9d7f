/* coro_switch_x86_64.S: the coroutine context switch for x86-64 (System V ABI).
 *
 *   void coro_switch_ctx(void **save_sp, void *load_sp);
 *   void coro_trampoline(void);
 *
 * coro_switch_ctx pushes the callee-saved state of the running context onto its own stack,
 * stores the resulting stack pointer in *save_sp, loads load_sp and pops the state that an
 * earlier coro_switch_ctx (or coro.c's initial frame) left there. Everything the ABI lets a
 * callee clobber (rax, rcx, rdx, rsi, rdi, r8-r11, xmm0-15, flags) is not saved: the caller of
 * coro_switch_ctx already assumes it is lost.
 *
 * Frame left at the saved stack pointer (offsets from it, in bytes):
 *
 *    0  MXCSR (4 bytes)        4  x87 control word (2 bytes)   6  padding (2 bytes)
 *    8  r15      16  r14      24  r13      32  r12      40  rbx      48  rbp
 *   56  return address
 *
 * MXCSR and the x87 control word ARE preserved (as hnes/libaco does, unlike lwan). The SysV ABI
 * makes their control bits (rounding mode, exception masks, flush-to-zero, precision) callee-
 * saved: a coroutine that sets a rounding mode and yields must not leak it into the next
 * coroutine the worker runs, nor pick up another coroutine's mode when it resumes. The cost is
 * a stmxcsr/ldmxcsr and fnstcw/fldcw pair per switch, a few cycles next to the rest of a
 * scheduler round trip; correctness across user code we do not control wins.
 *
 * A fresh coroutine's frame (built in coro.c) has r12 = the struct coro pointer, r13 = the C
 * entry function, rbp = 0 (so backtraces stop here) and coro_trampoline as return address. The
 * frame ends 16-byte aligned after the final ret, so the `call` in the trampoline meets the
 * ABI's alignment rule. The entry function never returns: it switches away for the last time.
 * Shadow stacks (CET) are not supported: the first switch into a coroutine `ret`s to an address
 * no `call` pushed. */

    .text

    .globl coro_switch_ctx
    .hidden coro_switch_ctx
    .type coro_switch_ctx, @function
    .p2align 4
coro_switch_ctx:
    .cfi_startproc
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .cfi_endproc
    .size coro_switch_ctx, .-coro_switch_ctx

    .globl coro_trampoline
    .hidden coro_trampoline
    .type coro_trampoline, @function
    .p2align 4
coro_trampoline:
    .cfi_startproc
    /* No caller frame to unwind into: mark the return address column undefined. */
    .cfi_undefined rip
    movq %r12, %rdi
    call *%r13
    /* Not reached: the entry function switches away for good. */
    ud2
    .cfi_endproc
    .size coro_trampoline, .-coro_trampoline

    .section .note.GNU-stack,"",@progbits
