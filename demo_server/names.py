"""Names shared by the demo server and its load generator, defined once here."""

# The model the demo server serves unless told otherwise, and the one its clients ask for.
MODEL_NAME = "batchscope-demo"
