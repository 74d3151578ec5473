"""gpudash: terminal dashboard, transfer engine and server supervisor for LLM inference boxes."""
