# GIL-free handler API (owned by native/server.pyx). Placeholder until the engine lands.
