"""The live body: the OpenAI-compatible gateway in front of an engine fleet."""
