"""Signed models: cosign's key formats, its simple-signing payload and where cosign and containers/image
keep signatures in a registry (the `sha256-<hex>.sig` tag)."""
