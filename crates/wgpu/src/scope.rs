//! Per-call error reporting: [`ErrorScope`] pushes wgpu error scopes around the wgpu calls of
//! one deltakv operation and [`ErrorScope::finish`] returns what they caught as that
//! operation's `Err`.
//!
//! wgpu keeps error scopes per thread (its `std` feature, which this crate enables): an error
//! goes to the innermost scope of the thread whose call raised it, else to the device's
//! uncaptured-error handler. So an operation on one thread never reports, nor swallows, an
//! error another thread's operation raised through the process's one shared [`Wgpu`]. Errors
//! raised outside any scope stay with the handler, and [`Wgpu::check`] reports them; a lost
//! device is reported by every scope and every check once it happens, since it concerns every
//! caller.
//!
//! Scopes form a stack per thread and must be popped in reverse order of their pushing (wgpu
//! panics otherwise). An `ErrorScope` is therefore made and finished within one function body,
//! and the calls it makes may open and finish their own scopes inside it: those catch their
//! own errors, which never reach the enclosing scope. The guard is neither `Send` nor `Sync`,
//! like wgpu's own, so it cannot be finished on another thread.

use crate::runtime::{Wgpu, one_line_error};
use deltakv_contract::Result;

/// The kinds of error a scope catches, in the order they are pushed (so popped in reverse).
const FILTERS: [wgpu::ErrorFilter; 3] = [
    wgpu::ErrorFilter::Internal,
    wgpu::ErrorFilter::OutOfMemory,
    wgpu::ErrorFilter::Validation,
];

/// The error scopes of one operation on the current thread: validation, out-of-memory and
/// internal errors raised by wgpu calls on this thread between [`Wgpu::error_scope`] and
/// [`ErrorScope::finish`] are caught here and reported by `finish`. Dropped without `finish`
/// (an early return with another error), it pops its scopes and discards what they caught.
#[must_use = "finish the scope to learn whether the wgpu calls it covers failed"]
pub(crate) struct ErrorScope<'a> {
    wgpu: &'a Wgpu,
    /// wgpu's guards, in the order of [`FILTERS`]; each is taken when popped.
    guards: [Option<wgpu::ErrorScopeGuard>; 3],
}

impl<'a> ErrorScope<'a> {
    pub(crate) fn new(wgpu: &'a Wgpu) -> Self {
        Self {
            wgpu,
            guards: FILTERS.map(|filter| Some(wgpu.device().push_error_scope(filter))),
        }
    }

    /// Pops the scopes and returns `Err` naming `what` was being done, folded onto one line:
    /// a lost device first (the cause of whatever else failed), then the first out-of-memory,
    /// internal or validation error caught, in that order (running out of memory or an
    /// internal failure leaves invalid objects whose later use fails validation).
    pub(crate) fn finish(mut self, what: &str) -> Result<()> {
        let caught = self.pop();
        if let Some(lost) = self.wgpu.lost() {
            return Err(one_line_error(what, lost));
        }
        let [internal, out_of_memory, validation] = caught;
        match out_of_memory.or(internal).or(validation) {
            Some(error) => Err(one_line_error(what, &error.to_string())),
            None => Ok(()),
        }
    }

    /// Pops the scopes still pushed, innermost first, and returns what each caught, in the
    /// order of [`FILTERS`].
    fn pop(&mut self) -> [Option<wgpu::Error>; 3] {
        let mut caught = [None, None, None];
        for (guard, slot) in self.guards.iter_mut().zip(caught.iter_mut()).rev() {
            if let Some(guard) = guard.take() {
                // Ready at once on Vulkan and Metal (wgpu-core's scopes are filled as each call
                // returns); pollster is how this crate waits on wgpu's futures.
                *slot = pollster::block_on(guard.pop());
            }
        }
        caught
    }
}

impl Drop for ErrorScope<'_> {
    fn drop(&mut self) {
        // wgpu's guards would pop in field order, outermost first, which it refuses.
        self.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WgpuTensor;
    use crate::testing::device;
    use deltakv_contract::HostTensor;
    use std::sync::Barrier;

    /// A buffer with no usage: wgpu raises a validation error ("usages can't be empty").
    fn provoke(wgpu: &Wgpu) {
        let _ = wgpu.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("deltakv invalid"),
            size: 16,
            usage: wgpu::BufferUsages::empty(),
            mapped_at_creation: false,
        });
    }

    #[test]
    fn an_error_is_reported_on_the_thread_that_raised_it() {
        let Some(wgpu) = device("error scopes") else {
            return;
        };
        // One thread raises an error inside its scope and holds the scope open while the other
        // runs whole operations and checks; only then does the first finish its scope.
        let host = HostTensor::from_f32(vec![3], vec![1.0, -2.0, 0.5]).unwrap();
        let raised = Barrier::new(2);
        let done = Barrier::new(2);
        let (failing, working) = std::thread::scope(|s| {
            let failing = s.spawn(|| {
                let scope = wgpu.error_scope();
                provoke(wgpu);
                raised.wait();
                done.wait();
                scope.finish("provoking a validation error")
            });
            let working = s.spawn(|| {
                raised.wait();
                let round_trip = WgpuTensor::upload(wgpu, &host)
                    .and_then(|t| t.copy(wgpu))
                    .and_then(|t| t.download(wgpu))
                    .and_then(|back| wgpu.check("after the round trip").map(|()| back));
                done.wait();
                round_trip
            });
            (failing.join(), working.join())
        });
        let back = working
            .expect("the working thread panicked")
            .expect("another thread's error reached this one");
        assert_eq!(back, host);
        let err = failing
            .expect("the failing thread panicked")
            .expect_err("the error was lost")
            .to_string();
        assert!(
            err.contains("provoking a validation error failed: "),
            "{err}"
        );
        assert!(!err.contains('\n'), "not one line: {err}");
        // Caught by the scope, so not left for anyone's check.
        wgpu.check("after the scopes").unwrap();
    }

    #[test]
    fn nested_scopes_report_their_own_errors() {
        let Some(wgpu) = device("nested error scopes") else {
            return;
        };
        let outer = wgpu.error_scope();
        let inner = wgpu.error_scope();
        provoke(wgpu);
        let err = inner.finish("the inner call").unwrap_err().to_string();
        assert!(err.contains("the inner call failed"), "{err}");
        outer.finish("the outer call").unwrap();
        // Dropped unfinished (an early return), a scope discards what it caught.
        {
            let _dropped = wgpu.error_scope();
            provoke(wgpu);
        }
        wgpu.check("after a dropped scope").unwrap();
    }
}
