"""dsa_route: the DSA routing decision, its vLLM plugin, and a PyTorch DSA reference implementation."""
