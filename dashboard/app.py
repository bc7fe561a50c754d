"""The Streamlit app: `streamlit run dashboard/app.py` (batchscope-dashboard runs it)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

VIEWS = Path(__file__).resolve().parent / "views"

st.set_page_config(page_title="batchscope", page_icon="📦", layout="wide")
page = st.navigation(
    [
        st.Page(VIEWS / "live.py", title="Live", icon="📈", default=True),
        st.Page(VIEWS / "calculator.py", title="Static batching calculator", icon="🧮"),
        st.Page(VIEWS / "load_tests.py", title="Load tests", icon="🏋️"),
        st.Page(VIEWS / "alerts.py", title="Alerts", icon="🚨"),
    ]
)
page.run()
