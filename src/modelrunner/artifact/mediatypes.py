"""Media types of DMR's OCI model artifacts (contract section 3.1)."""

from __future__ import annotations

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST_V2})

CONFIG_V01 = "application/vnd.docker.ai.model.config.v0.1+json"
CONFIG_V02 = "application/vnd.docker.ai.model.config.v0.2+json"
CONFIG_CNCF = "application/vnd.cncf.model.config.v1+json"
SUPPORTED_CONFIG_TYPES = frozenset({CONFIG_V01, CONFIG_V02, CONFIG_CNCF})
CNCF_MANIFEST_ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"

GGUF = "application/vnd.docker.ai.gguf.v3"
SAFETENSORS = "application/vnd.docker.ai.safetensors"
DDUF = "application/vnd.docker.ai.dduf"
LICENSE = "application/vnd.docker.ai.license"
MMPROJ = "application/vnd.docker.ai.mmproj"
CHAT_TEMPLATE = "application/vnd.docker.ai.chat.template.jinja"
MODEL_FILE = "application/vnd.docker.ai.model.file"
VLLM_CONFIG_TAR = "application/vnd.docker.ai.vllm.config.tar"
DIR_TAR = "application/vnd.docker.ai.dir.tar"

CNCF_WEIGHT_GGUF = "application/vnd.cncf.model.weight.v1.gguf"
CNCF_WEIGHT_SAFETENSORS = "application/vnd.cncf.model.weight.v1.safetensors"
CNCF_WEIGHT_RAW = "application/vnd.cncf.model.weight.v1.raw"
CNCF_WEIGHT_CONFIG_RAW = "application/vnd.cncf.model.weight.config.v1.raw"
CNCF_DOC_RAW = "application/vnd.cncf.model.doc.v1.raw"
CNCF_CODE_RAW = "application/vnd.cncf.model.code.v1.raw"
CNCF_DATASET_RAW = "application/vnd.cncf.model.dataset.v1.raw"

# Layer annotations the builder sets on every layer (contract 3.1).
ANNOTATION_FILEPATH = "org.cncf.model.filepath"
ANNOTATION_FILE_METADATA = "org.cncf.model.file.metadata+json"
ANNOTATION_MEDIATYPE_UNTESTED = "org.cncf.model.file.mediatype.untested"

FORMAT_GGUF = "gguf"
FORMAT_SAFETENSORS = "safetensors"
FORMAT_DDUF = "dduf"

# The model format of each of DMR's weight layer types (what `model search` reads off a manifest).
WEIGHT_FORMATS = {GGUF: FORMAT_GGUF, SAFETENSORS: FORMAT_SAFETENSORS, DDUF: FORMAT_DDUF}
