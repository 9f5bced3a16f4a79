"""LTX-2 text-to-video with its audio track."""
