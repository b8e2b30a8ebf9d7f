# Test hook for the HTTP parser conformance tests. Placeholder until the parser lands.
