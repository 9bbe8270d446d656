"""forensics: why a distributed GPU training job was slow or died."""

__version__ = "0.1.0"
