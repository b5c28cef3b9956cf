"""The image-generation server the diffusers engine runs: one DDUF pipeline on a Unix socket.

It runs inside the diffusers environment (torch, diffusers, fastapi, uvicorn), not in the model runner's
venv, so it imports nothing from modelrunner outside this package. `dduf` and `params` use only the standard
library (the model runner's unit tests import them); `pipeline` is the only module that imports torch.
"""
