"""The Streamlit app: `streamlit run dashboard/app.py` (batchscope-dashboard runs it)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

VIEWS = Path(__file__).resolve().parent / "views"

# The pages in a top bar and the sidebar (where the data comes from) folded: the Live page's
# fleet table gets the whole width of a 1400 px window.
st.set_page_config(
    page_title="batchscope",
    page_icon=":material/stacked_bar_chart:",
    layout="wide",
    initial_sidebar_state="collapsed",
)
# The pages' own top margin, less than Streamlit's under a top bar: the Live page's first
# screen answers at 1400x900 without scrolling.
st.html("<style>[data-testid='stMainBlockContainer'] { padding-top: 4.5rem; }</style>")
page = st.navigation(
    [
        st.Page(VIEWS / "live.py", title="Live", icon=":material/monitoring:", default=True),
        st.Page(
            VIEWS / "calculator.py", title="Static batching calculator", icon=":material/calculate:"
        ),
        st.Page(VIEWS / "load_tests.py", title="Load tests", icon=":material/speed:"),
        st.Page(VIEWS / "alerts.py", title="Alerts", icon=":material/notifications_active:"),
    ],
    position="top",
)
page.run()
