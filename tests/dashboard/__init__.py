"""The Streamlit app: its model, pages, CLI and a real browser."""
