# Scheduler wrappers. Placeholder until the runtime lands.
