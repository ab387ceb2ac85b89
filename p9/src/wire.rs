//! Framing on top of rs9p's codec: size-prefixed frames, checked before anything is decoded.
