"""pretrieve: pre-train, fine-tune, index and evaluate dense passage retrievers."""

__version__ = "0.1.0"
