"""Getting models from registries and Hugging Face, and sending them to registries.

`registry` speaks the OCI distribution API (auth, redirects, retries), `pull` and `push` move one model
with progress events, `huggingface` builds models from Hub repositories. The daemon runs them as jobs
with the trust policy applied (server/transfers.py: above signing/, which uses this package's registry
client).
"""
