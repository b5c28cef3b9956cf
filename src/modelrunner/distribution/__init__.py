"""Getting models from registries and Hugging Face, and sending them to registries.

`registry` speaks the OCI distribution API (auth, redirects, retries), `pull` and `push` move one model
with progress events, `huggingface` builds models from Hub repositories, `jobs` runs pulls for the daemon
(shared downloads, a bound on concurrent pulls, cancellation).
"""
