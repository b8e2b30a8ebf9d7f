# Coroutine scheduler API (owned by native/sched.pyx). Placeholder until the runtime lands.
