//! The per-server reply queue: one entry per message written to the server that expects
//! a reply, in order, with what to do with that reply. PostgreSQL's replies carry no names,
//! so this queue is the only way to know which request a reply answers.

use crate::protocol::tags;
use std::collections::VecDeque;

/// A request written to the server that will be answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Req {
    /// Parse → ParseComplete.
    Parse,
    /// Bind → BindComplete.
    Bind,
    /// Describe → [ParameterDescription] RowDescription | NoData.
    Describe,
    /// Execute → rows, then CommandComplete | EmptyQueryResponse | PortalSuspended.
    Execute,
    /// Close → CloseComplete.
    Close,
    /// Sync → ReadyForQuery.
    Sync,
    /// Query → anything, then ReadyForQuery.
    Query,
    /// FunctionCall → FunctionCallResponse, then ReadyForQuery.
    FunctionCall,
}

impl Req {
    /// True for requests whose error makes the server skip to the next Sync.
    pub fn is_extended(self) -> bool {
        !matches!(self, Req::Sync | Req::Query | Req::FunctionCall)
    }

    /// True when `tag` is the last reply to this request.
    #[inline]
    pub fn completed_by(self, tag: u8) -> bool {
        match self {
            Req::Parse => tag == tags::PARSE_COMPLETE,
            Req::Bind => tag == tags::BIND_COMPLETE,
            Req::Close => tag == tags::CLOSE_COMPLETE,
            Req::Describe => tag == tags::ROW_DESCRIPTION || tag == tags::NO_DATA,
            Req::Execute => {
                tag == tags::COMMAND_COMPLETE || tag == tags::EMPTY_QUERY_RESPONSE || tag == tags::PORTAL_SUSPENDED
            }
            Req::Sync | Req::Query | Req::FunctionCall => tag == tags::READY_FOR_QUERY,
        }
    }
}

/// What happens to the replies of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnReply {
    /// The client asked: forward the replies.
    Forward,
    /// The pooler asked on its own behalf: drop the replies.
    Skip,
}

/// Why the pooler sent a request it skips the replies of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// The client's own request.
    Client,
    /// Settings replayed onto the server for this client.
    SyncSettings,
    /// A ROLLBACK the pooler sent (statement mode, abandoned transaction).
    Rollback,
}

/// One queue entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// The request.
    pub req: Req,
    /// What to do with its replies.
    pub on_reply: OnReply,
    /// Why it was sent.
    pub purpose: Purpose,
    /// For a client Query that changes session state (SET, RESET, DISCARD): its text, so
    /// the change can be replayed on other server connections once it succeeded.
    pub tracked_sql: Option<Box<str>>,
    /// An ErrorResponse answered this request.
    pub failed: bool,
}

impl Pending {
    /// A client request whose replies are forwarded.
    pub fn client(req: Req) -> Pending {
        Pending { req, on_reply: OnReply::Forward, purpose: Purpose::Client, tracked_sql: None, failed: false }
    }
    /// A request of the pooler's own.
    pub fn internal(req: Req, purpose: Purpose) -> Pending {
        Pending { req, on_reply: OnReply::Skip, purpose, tracked_sql: None, failed: false }
    }
}

/// The FIFO of outstanding requests on the linked server.
#[derive(Debug, Default)]
pub struct ReplyQueue {
    q: VecDeque<Pending>,
}

impl ReplyQueue {
    /// Appends a request written to the server.
    #[inline]
    pub fn push(&mut self, p: Pending) {
        self.q.push_back(p);
    }
    /// Puts a request in front of everything queued (it is written before them).
    pub fn push_front(&mut self, p: Pending) {
        self.q.push_front(p);
    }
    /// The request the next reply answers.
    #[inline]
    pub fn head(&self) -> Option<&Pending> {
        self.q.front()
    }
    /// Mutable head.
    pub fn head_mut(&mut self) -> Option<&mut Pending> {
        self.q.front_mut()
    }
    /// Removes the head.
    #[inline]
    pub fn pop(&mut self) -> Option<Pending> {
        self.q.pop_front()
    }
    /// After an ErrorResponse to an extended-protocol request: the server ignores everything
    /// up to the next Sync, so those entries will get no reply. Returns how many were dropped.
    pub fn skip_to_sync(&mut self) -> usize {
        let mut n = 0;
        while let Some(p) = self.q.front() {
            if p.req == Req::Sync {
                break;
            }
            self.q.pop_front();
            n += 1;
        }
        n
    }
    /// In COPY FROM STDIN mode the server ignores Sync and Flush: drop the Syncs queued
    /// right behind the head (the Execute that started the copy).
    pub fn drop_syncs_after_head(&mut self) {
        while self.q.len() > 1 && self.q[1].req == Req::Sync && self.q[1].purpose == Purpose::Client {
            self.q.remove(1);
        }
    }
    /// Nothing outstanding.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
    /// Number of outstanding requests.
    pub fn len(&self) -> usize {
        self.q.len()
    }
    /// Forgets everything (the server connection is gone).
    pub fn clear(&mut self) {
        self.q.clear();
    }
    /// Iterates outstanding requests, head first.
    pub fn iter(&self) -> impl Iterator<Item = &Pending> {
        self.q.iter()
    }
}
