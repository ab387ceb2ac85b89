//! 9P's Tflush between our client and our server, over one connection.
//!
//! What is modelled (p9/src/client.rs, p9/src/server.rs, specs/9p.md): the client issues
//! requests on free tags and may give one up before its reply (a FUSE_INTERRUPT, a dropped
//! future), sending Tflush on another tag; the server runs requests concurrently and completes
//! them in any order, and on Tflush cancels a request still in flight. Both directions are
//! ordered streams (a unix socket). The client keeps a flushed request's tag reserved until
//! Rflush arrives; the server, once it has sent Rflush, never replies to the old tag. Together
//! these make a tag safe to reuse: a reply always reaches the request that carried its tag.
//!
//! Left out: message contents, fids, the server's reply order within a cancel (one step here),
//! running out of tags (the client then lets the reply free the tag, no Tflush).

use stateright::{Model, Property};

/// A planted defect, to show the properties catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// The client frees a tag when it sends Tflush instead of when Rflush arrives.
    ClientFreesTagAtFlush,
    /// The server sends Rflush at once and lets the flushed request run on and reply.
    ServerRepliesAfterRflush,
}

/// `requests` requests over `tags` tags.
#[derive(Clone, Debug)]
pub struct Flush {
    pub tags: usize,
    pub requests: u8,
    pub bug: Option<Bug>,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Msg {
    T { tag: usize, req: u8 },
    TFlush { tag: usize, oldtag: usize },
    R { tag: usize, req: u8 },
    RFlush { tag: usize },
}

/// What the client keeps for a tag in use.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Pending {
    Waiting(u8),
    /// Given up on: Tflush sent; reserved until Rflush.
    Flushing,
    /// The Tflush itself.
    Flush {
        oldtag: usize,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State {
    pub to_server: Vec<Msg>,
    pub to_client: Vec<Msg>,
    pub pending: Vec<Option<Pending>>,
    pub issued: u8,
    /// Requests the server is running: (tag, request).
    pub in_flight: Vec<(usize, u8)>,
    // Ghost variables for the properties.
    pub misrouted: bool,
    pub tag_in_flight_twice: bool,
    pub stray_reply: bool,
    pub delivered: u8,
    pub reply_beat_flush: bool,
    pub tag_reused_after_flush: bool,
    pub flushed_tags: Vec<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Issue,
    GiveUp(usize),
    ServerReceives,
    Complete(usize),
    ClientReceives,
}

impl Flush {
    fn free_tag(&self, s: &State) -> Option<usize> {
        s.pending.iter().position(Option::is_none)
    }
}

impl Model for Flush {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            to_server: Vec::new(),
            to_client: Vec::new(),
            pending: vec![None; self.tags],
            issued: 0,
            in_flight: Vec::new(),
            misrouted: false,
            tag_in_flight_twice: false,
            stray_reply: false,
            delivered: 0,
            reply_beat_flush: false,
            tag_reused_after_flush: false,
            flushed_tags: vec![false; self.tags],
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.issued < self.requests && self.free_tag(s).is_some() {
            actions.push(Action::Issue);
        }
        for (tag, p) in s.pending.iter().enumerate() {
            if matches!(p, Some(Pending::Waiting(_))) {
                actions.push(Action::GiveUp(tag));
            }
        }
        if !s.to_server.is_empty() {
            actions.push(Action::ServerReceives);
        }
        for i in 0..s.in_flight.len() {
            actions.push(Action::Complete(i));
        }
        if !s.to_client.is_empty() {
            actions.push(Action::ClientReceives);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Issue => {
                let tag = self.free_tag(&s)?;
                let req = s.issued;
                s.issued += 1;
                s.tag_reused_after_flush |= s.flushed_tags[tag];
                s.pending[tag] = Some(Pending::Waiting(req));
                s.to_server.push(Msg::T { tag, req });
            }
            Action::GiveUp(oldtag) => {
                // The Tflush needs a tag of its own; with none free the client just waits.
                let Some(Pending::Waiting(_)) = s.pending[oldtag] else {
                    return None;
                };
                s.pending[oldtag] = Some(Pending::Flushing);
                let tag = self.free_tag(&s)?;
                s.pending[tag] = Some(Pending::Flush { oldtag });
                if self.bug == Some(Bug::ClientFreesTagAtFlush) {
                    s.pending[oldtag] = None;
                }
                s.flushed_tags[oldtag] = true;
                s.to_server.push(Msg::TFlush { tag, oldtag });
            }
            Action::ServerReceives => match s.to_server.remove(0) {
                Msg::T { tag, req } => {
                    s.tag_in_flight_twice |= s.in_flight.iter().any(|(t, _)| *t == tag);
                    s.in_flight.push((tag, req));
                }
                Msg::TFlush { tag, oldtag } => {
                    if self.bug != Some(Bug::ServerRepliesAfterRflush) {
                        // Cancelled: its reply is never queued. A request already answered
                        // has its reply ahead of this Rflush in the stream.
                        s.in_flight.retain(|(t, _)| *t != oldtag);
                    }
                    s.to_client.push(Msg::RFlush { tag });
                }
                Msg::R { .. } | Msg::RFlush { .. } => unreachable!("replies travel to the client"),
            },
            Action::Complete(i) => {
                let (tag, req) = s.in_flight.remove(i);
                s.to_client.push(Msg::R { tag, req });
            }
            Action::ClientReceives => match s.to_client.remove(0) {
                Msg::R { tag, req } => match s.pending[tag] {
                    Some(Pending::Waiting(waiting)) => {
                        s.misrouted |= waiting != req;
                        s.delivered += 1;
                        s.pending[tag] = None;
                    }
                    // The flushed request's reply won the race: dropped, tag still reserved.
                    Some(Pending::Flushing) => s.reply_beat_flush = true,
                    Some(Pending::Flush { .. }) => s.misrouted = true,
                    None => s.stray_reply = true,
                },
                Msg::RFlush { tag } => match s.pending[tag] {
                    Some(Pending::Flush { oldtag }) => {
                        s.pending[tag] = None;
                        if s.pending[oldtag] == Some(Pending::Flushing) {
                            s.pending[oldtag] = None;
                        }
                    }
                    Some(_) => s.misrouted = true,
                    None => s.stray_reply = true,
                },
                Msg::T { .. } | Msg::TFlush { .. } => {
                    unreachable!("requests travel to the server")
                }
            },
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a reply reaches the request that carried its tag",
                |_, s: &State| !s.misrouted && !s.stray_reply,
            ),
            Property::always(
                "the server never runs two requests on one tag",
                |_, s: &State| !s.tag_in_flight_twice,
            ),
            Property::sometimes(
                "a flushed request's reply beats its Rflush",
                |_, s: &State| s.reply_beat_flush,
            ),
            Property::sometimes("a flushed tag is used again", |_, s: &State| {
                s.tag_reused_after_flush && s.delivered > 0
            }),
        ]
    }
}
