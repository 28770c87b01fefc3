"""protocol.md conformance suite: one case per normative statement, each naming its section (see README.md)."""
