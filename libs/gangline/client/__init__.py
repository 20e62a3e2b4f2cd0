"""The people's command line: ``gangline submit|status|why|cancel|queues|nodes``, talking to the API.

The API is found at ``GANGLINE_API_URL`` (default http://127.0.0.1:8080) with the bearer token in
``GANGLINE_TOKEN``. ``services.tools.cli`` registers each subcommand with one line (see
:data:`commands.COMMANDS`).
"""

from gangline.client.api_client import ApiClient, ApiError

__all__ = ["ApiClient", "ApiError"]
