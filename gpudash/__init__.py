"""gpudash: terminal dashboard, transfer engine and server supervisor for LLM inference boxes."""

APP_NAME = "gpudash"  # platformdirs' name for gpudash's config, data, cache and log directories
