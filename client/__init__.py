"""metal_runner client: protocol (the wire codec), connection (Runner, one TCP connection to a runner)."""
