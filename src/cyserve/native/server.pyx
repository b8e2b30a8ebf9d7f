# HTTP engine wrappers. Placeholder until the engine lands.
