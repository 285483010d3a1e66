//! PAM password checks (`login::Step::CheckPassword` with `Checker::Pam`), as PostgreSQL
//! makes them: `pam_start` with the service (`auth_pam_service`, or an hba line's
//! `pamservice=`) and the user name, the client's address as `PAM_RHOST`, a conversation
//! that answers a hidden prompt with the client's password (and refuses a visible one),
//! then `pam_authenticate` and `pam_acct_mgmt`. With `auth_pam_config_dir`, the service
//! is read from that directory (`pam_start_confdir`, Linux-PAM 1.4 and later) instead of
//! /etc/pam.d.
//!
//! Owns: the minimal FFI to the system's libpam (opened at the first check, `PAM`), and
//! running its calls, which block, on
//! tokio's blocking threads, at most `MAX_AT_ONCE` at a time. Why a check failed is logged
//! here; the client only learns that it failed. A check still running when the login's
//! timeout ends it finishes on its thread, its answer dropped.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::{Arc, LazyLock};
use tokio::sync::Semaphore;

/// PAM conversations run at once; more wait their turn (within their login's timeout).
const MAX_AT_ONCE: usize = 4;

static LIMIT: LazyLock<Arc<Semaphore>> = LazyLock::new(|| Arc::new(Semaphore::new(MAX_AT_ONCE)));

/// Whether `password` is `user`'s, by PAM service `service` (read from `dir`, or the
/// system's directory when empty); `rhost`: the client's address.
pub(crate) async fn check(
    service: String,
    dir: String,
    user: String,
    password: Vec<u8>,
    rhost: Option<String>,
) -> bool {
    let Ok(permit) = LIMIT.clone().acquire_owned().await else { return false };
    let who = user.clone();
    let res = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        authenticate(&service, &dir, &user, password, rhost.as_deref())
    })
    .await;
    match res {
        Ok(Ok(())) => true,
        Ok(Err(Failure::Refused(why))) => {
            tracing::info!(user = %who, "PAM authentication failed: {why}");
            false
        }
        Ok(Err(Failure::Broken(why))) => {
            tracing::warn!(user = %who, "PAM authentication failed: {why}");
            false
        }
        Err(e) => {
            tracing::warn!(user = %who, error = %e, "PAM authentication failed: its task failed");
            false
        }
    }
}

/// Why a check failed.
enum Failure {
    /// PAM said no.
    Refused(String),
    /// PAM could not be asked, or failed.
    Broken(String),
}

const PAM_SUCCESS: c_int = 0;
const PAM_BUF_ERR: c_int = 5;
const PAM_PERM_DENIED: c_int = 6;
const PAM_AUTH_ERR: c_int = 7;
const PAM_USER_UNKNOWN: c_int = 10;
const PAM_MAXTRIES: c_int = 11;
const PAM_NEW_AUTHTOK_REQD: c_int = 12;
const PAM_ACCT_EXPIRED: c_int = 13;
const PAM_CONV_ERR: c_int = 19;
const PAM_RHOST: c_int = 4;
const PAM_PROMPT_ECHO_OFF: c_int = 1;
const PAM_ERROR_MSG: c_int = 3;
const PAM_TEXT_INFO: c_int = 4;
/// Linux-PAM's `PAM_MAX_NUM_MSG`.
const PAM_MAX_NUM_MSG: c_int = 32;

#[repr(C)]
struct PamMessage {
    msg_style: c_int,
    msg: *const c_char,
}

#[repr(C)]
struct PamResponse {
    resp: *mut c_char,
    resp_retcode: c_int,
}

type ConvFn = unsafe extern "C" fn(c_int, *mut *const PamMessage, *mut *mut PamResponse, *mut c_void) -> c_int;

#[repr(C)]
struct PamConv {
    conv: Option<ConvFn>,
    appdata_ptr: *mut c_void,
}

/// libpam's opaque handle.
#[repr(C)]
struct PamHandle {
    _private: [u8; 0],
}

type StartFn = unsafe extern "C" fn(*const c_char, *const c_char, *const PamConv, *mut *mut PamHandle) -> c_int;
type StartConfdirFn =
    unsafe extern "C" fn(*const c_char, *const c_char, *const PamConv, *const c_char, *mut *mut PamHandle) -> c_int;
type SetItemFn = unsafe extern "C" fn(*mut PamHandle, c_int, *const c_void) -> c_int;
type FlagsFn = unsafe extern "C" fn(*mut PamHandle, c_int) -> c_int;
type StrerrorFn = unsafe extern "C" fn(*mut PamHandle, c_int) -> *const c_char;

/// The system's libpam, opened when the first PAM check runs (`dlopen` of libpam.so.0,
/// which every Linux with PAM has; building parsnip needs no PAM headers or link library).
struct Pam {
    start: StartFn,
    /// Linux-PAM 1.4 and later.
    start_confdir: Option<StartConfdirFn>,
    set_item: SetItemFn,
    authenticate: FlagsFn,
    acct_mgmt: FlagsFn,
    end: FlagsFn,
    strerror: StrerrorFn,
}

static PAM: LazyLock<Result<Pam, String>> = LazyLock::new(open_libpam);

fn open_libpam() -> Result<Pam, String> {
    // SAFETY: dlopen/dlsym with NUL-terminated names; each symbol is cast to the signature
    // libpam's headers give it. The handle is never closed: the functions stay valid.
    unsafe {
        let lib = libc::dlopen(c"libpam.so.0".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if lib.is_null() {
            let why = libc::dlerror();
            let why = if why.is_null() { "unknown".into() } else { CStr::from_ptr(why).to_string_lossy() };
            return Err(format!("libpam.so.0 could not be loaded: {why}"));
        }
        let sym = |name: &CStr| {
            let p = libc::dlsym(lib, name.as_ptr());
            if p.is_null() { None } else { Some(p) }
        };
        let need = |name: &CStr| sym(name).ok_or_else(|| format!("libpam has no {}", name.to_string_lossy()));
        Ok(Pam {
            start: std::mem::transmute::<*mut c_void, StartFn>(need(c"pam_start")?),
            start_confdir: sym(c"pam_start_confdir").map(|p| std::mem::transmute::<*mut c_void, StartConfdirFn>(p)),
            set_item: std::mem::transmute::<*mut c_void, SetItemFn>(need(c"pam_set_item")?),
            authenticate: std::mem::transmute::<*mut c_void, FlagsFn>(need(c"pam_authenticate")?),
            acct_mgmt: std::mem::transmute::<*mut c_void, FlagsFn>(need(c"pam_acct_mgmt")?),
            end: std::mem::transmute::<*mut c_void, FlagsFn>(need(c"pam_end")?),
            strerror: std::mem::transmute::<*mut c_void, StrerrorFn>(need(c"pam_strerror")?),
        })
    }
}

/// A copy of `s` in memory PAM may `free`.
fn malloc_copy(s: &CStr) -> *mut c_char {
    let bytes = s.to_bytes_with_nul();
    // SAFETY: a fresh allocation of the right size, filled before it is handed on.
    unsafe {
        let p = libc::malloc(bytes.len()).cast::<c_char>();
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), p, bytes.len());
        }
        p
    }
}

/// The conversation: a hidden prompt is answered with the password (`data`, a `CString`);
/// messages are logged and answered with nothing; anything else fails it, as in
/// PostgreSQL.
unsafe extern "C" fn converse(
    n: c_int,
    msgs: *mut *const PamMessage,
    resp: *mut *mut PamResponse,
    data: *mut c_void,
) -> c_int {
    if n <= 0 || n > PAM_MAX_NUM_MSG || msgs.is_null() || resp.is_null() || data.is_null() {
        return PAM_CONV_ERR;
    }
    let n = n as usize;
    // SAFETY: libpam passes `n` message pointers and a place for the replies, and `data`
    // is the `CString` `authenticate` keeps alive through the conversation; the replies are
    // allocated with malloc, as libpam frees them.
    unsafe {
        let password = &*data.cast::<CString>();
        let replies = libc::calloc(n, std::mem::size_of::<PamResponse>()).cast::<PamResponse>();
        if replies.is_null() {
            return PAM_BUF_ERR;
        }
        let fail = |code: c_int| {
            for i in 0..n {
                libc::free((*replies.add(i)).resp.cast());
            }
            libc::free(replies.cast());
            code
        };
        for i in 0..n {
            let m = *msgs.add(i);
            if m.is_null() {
                return fail(PAM_CONV_ERR);
            }
            let text = || {
                if (*m).msg.is_null() { String::new() } else { CStr::from_ptr((*m).msg).to_string_lossy().into_owned() }
            };
            let answer = match (*m).msg_style {
                PAM_PROMPT_ECHO_OFF => password.as_c_str(),
                PAM_ERROR_MSG | PAM_TEXT_INFO => {
                    tracing::info!(message = %text(), "PAM says");
                    c""
                }
                style => {
                    tracing::info!(style, message = %text(), "unsupported PAM conversation");
                    return fail(PAM_CONV_ERR);
                }
            };
            let copy = malloc_copy(answer);
            if copy.is_null() {
                return fail(PAM_BUF_ERR);
            }
            (*replies.add(i)).resp = copy;
            (*replies.add(i)).resp_retcode = 0;
        }
        *resp = replies;
        PAM_SUCCESS
    }
}

/// PAM's words for `code`.
fn describe(pam: &Pam, pamh: *mut PamHandle, code: c_int) -> String {
    // SAFETY: pam_strerror returns a static string (or NULL).
    let s = unsafe { (pam.strerror)(pamh, code) };
    if s.is_null() {
        return format!("PAM error {code}");
    }
    // SAFETY: a NUL-terminated string of libpam's.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// One check, on a blocking thread.
fn authenticate(service: &str, dir: &str, user: &str, password: Vec<u8>, rhost: Option<&str>) -> Result<(), Failure> {
    let pam = PAM.as_ref().map_err(|e| Failure::Broken(e.clone()))?;
    let c = |s: &str, what: &str| CString::new(s).map_err(|_| Failure::Broken(format!("{what} contains a NUL")));
    let service = c(service, "the PAM service name")?;
    let user = c(user, "the user name")?;
    let dir = if dir.is_empty() { None } else { Some(c(dir, "auth_pam_config_dir")?) };
    let rhost = rhost.map(|h| c(h, "the client address")).transpose()?;
    let password = CString::new(password).map_err(|_| Failure::Refused("the password contains a NUL".into()))?;
    let conv = PamConv { conv: Some(converse), appdata_ptr: (&raw const password).cast_mut().cast() };
    let mut pamh: *mut PamHandle = std::ptr::null_mut();
    // SAFETY: every pointer handed to libpam outlives the handle (`pam_end` below is
    // reached on every path once `pam_start` succeeded).
    unsafe {
        let rc = match (&dir, pam.start_confdir) {
            (Some(d), Some(start_confdir)) => {
                start_confdir(service.as_ptr(), user.as_ptr(), &conv, d.as_ptr(), &mut pamh)
            }
            (Some(_), None) => {
                return Err(Failure::Broken(
                    "auth_pam_config_dir needs Linux-PAM 1.4 or later (pam_start_confdir)".into(),
                ));
            }
            (None, _) => (pam.start)(service.as_ptr(), user.as_ptr(), &conv, &mut pamh),
        };
        if rc != PAM_SUCCESS || pamh.is_null() {
            return Err(Failure::Broken(format!("pam_start failed: {}", describe(pam, pamh, rc))));
        }
        let mut res = Ok(());
        if let Some(h) = &rhost {
            let rc = (pam.set_item)(pamh, PAM_RHOST, h.as_ptr().cast());
            if rc != PAM_SUCCESS {
                res = Err(Failure::Broken(format!("pam_set_item(PAM_RHOST) failed: {}", describe(pam, pamh, rc))));
            }
        }
        let mut rc = PAM_SUCCESS;
        if res.is_ok() {
            rc = (pam.authenticate)(pamh, 0);
            if rc != PAM_SUCCESS {
                res = Err(failure("pam_authenticate", rc, describe(pam, pamh, rc)));
            }
        }
        if res.is_ok() {
            rc = (pam.acct_mgmt)(pamh, 0);
            if rc != PAM_SUCCESS {
                res = Err(failure("pam_acct_mgmt", rc, describe(pam, pamh, rc)));
            }
        }
        (pam.end)(pamh, rc);
        res
    }
}

fn failure(call: &str, code: c_int, why: String) -> Failure {
    let refused = matches!(
        code,
        PAM_AUTH_ERR | PAM_USER_UNKNOWN | PAM_PERM_DENIED | PAM_MAXTRIES | PAM_NEW_AUTHTOK_REQD | PAM_ACCT_EXPIRED
    );
    let why = format!("{call} failed: {why}");
    if refused { Failure::Refused(why) } else { Failure::Broken(why) }
}
