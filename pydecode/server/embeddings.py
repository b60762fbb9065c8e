"""/v1/embeddings (served with --embedding)."""
from __future__ import annotations

from .params import APIError


async def embeddings(request, state):
    raise APIError(501, "embeddings are not available yet: pydecode's C core returns logits, not the pooled "
                        "hidden state an embedding needs", code="not_supported")
