//! state.json and the slot model. (owner: host-side)
