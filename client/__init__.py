"""metal_runner client: protocol (the wire codec), connection (Runner, one TCP connection to a runner)."""
METAL_RUNNER_CLIENT = True   # the metal-client command (metal_client.py) checks that the import name `client` is this package
