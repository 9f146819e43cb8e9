package idalloc

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Kind is the service's error kind (the "kind" field of its JSON errors, docs/guide/api.md).
type Kind string

// A sentinel for each error kind of the service, for errors.Is:
//
//	if errors.Is(err, idalloc.ErrExhausted) { ... }
var (
	ErrUnauthenticated      error = kindSentinel("unauthenticated")
	ErrForbidden            error = kindSentinel("forbidden")
	ErrRateLimited          error = kindSentinel("rate_limited")
	ErrQuotaExceeded        error = kindSentinel("quota_exceeded")
	ErrInvalidInput         error = kindSentinel("invalid_input")
	ErrPoolNotFound         error = kindSentinel("pool_not_found")
	ErrNotFound             error = kindSentinel("not_found")
	ErrSessionNotFound      error = kindSentinel("session_not_found")
	ErrRangeMismatch        error = kindSentinel("range_mismatch")
	ErrHolderReserved       error = kindSentinel("holder_reserved")
	ErrPoolReplaced         error = kindSentinel("pool_replaced")
	ErrExhausted            error = kindSentinel("exhausted")
	ErrConflict             error = kindSentinel("conflict")
	ErrTooLarge             error = kindSentinel("too_large")
	ErrOverloaded           error = kindSentinel("overloaded")
	ErrUnsupportedMediaType error = kindSentinel("unsupported_media_type")
	ErrMethodNotAllowed     error = kindSentinel("method_not_allowed")
	ErrGone                 error = kindSentinel("gone")
	ErrInternal             error = kindSentinel("internal")
	ErrUnavailable          error = kindSentinel("unavailable")
	ErrAccessDenied         error = kindSentinel("access_denied")
	ErrCorrupt              error = kindSentinel("corrupt")

	// ErrPoolInUse: deleting a pool that still has records without force (409 invalid_input).
	// Such an error also matches ErrInvalidInput.
	ErrPoolInUse error = errors.New("idalloc: pool in use")
	// ErrSessionLost: the session's lease is gone (it expired or was ended); its references are
	// gone with it. Reported by Session.Err once Session.Lost is closed.
	ErrSessionLost error = errors.New("idalloc: session lost")
	// ErrBadAnswer: a 2xx answer whose body is not what the API documents.
	ErrBadAnswer error = errors.New("idalloc: answer not as documented")
)

type kindSentinel string

func (k kindSentinel) Error() string { return "idalloc: " + string(k) }

// Error is an error answer of the service: its HTTP status and its {"kind","message"} body.
// Match it with errors.Is against the sentinels (ErrExhausted, ...) or errors.As for the fields.
type Error struct {
	// Op names the call ("acquire", "pool create", ...).
	Op string
	// Status is the HTTP status; Kind and Message are the body's. A body that was not the
	// service's error JSON (a proxy's page) has an empty Kind.
	Status  int
	Kind    Kind
	Message string
	// RetryAfter is the answer's Retry-After (0 if none).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Kind == "" {
		return fmt.Sprintf("idalloc: %s: HTTP %d without an error body (a proxy before the service?)", e.Op, e.Status)
	}
	return fmt.Sprintf("idalloc: %s: %d %s: %s", e.Op, e.Status, e.Kind, e.Message)
}

// Is matches the sentinel of the error's kind; ErrPoolInUse for 409 invalid_input;
// ErrUnavailable also for a proxy's 502–504.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrPoolInUse:
		return e.Kind == "invalid_input" && e.Status == 409
	case ErrUnavailable:
		if e.Kind == "" && e.Status >= 502 && e.Status <= 504 {
			return true
		}
	}
	if k, ok := target.(kindSentinel); ok {
		return string(k) == string(e.Kind)
	}
	return false
}

// Retryable reports whether the same call may succeed if repeated, on this or another replica:
// unavailable, overloaded, rate_limited, pool_replaced, or a proxy's 502–504 (docs/guide/api.md).
func (e *Error) Retryable() bool {
	switch e.Kind {
	case "unavailable", "overloaded", "rate_limited", "pool_replaced":
		return true
	case "":
		return e.Status >= 502 && e.Status <= 504
	}
	return false
}

// TransportError: no endpoint answered (refused, reset, timed out, cut off) within the attempts.
// It matches ErrUnavailable. Its text names the endpoints, never a request path (a session's path
// holds its secret id).
type TransportError struct {
	Op string
	// Last is the last endpoint tried and Err what happened there.
	Last string
	Err  error
}

func (e *TransportError) Error() string {
	return fmt.Sprintf("idalloc: %s: no endpoint answered (last %s: %v)", e.Op, e.Last, e.Err)
}

func (e *TransportError) Unwrap() error { return e.Err }

// Is matches ErrUnavailable.
func (e *TransportError) Is(target error) bool { return target == ErrUnavailable }

// IsRetryable reports whether err is worth retrying later: a retryable service answer or no
// answer at all.
func IsRetryable(err error) bool {
	var te *TransportError
	if errors.As(err, &te) {
		return true
	}
	var ae *Error
	return errors.As(err, &ae) && ae.Retryable()
}

// InputError is a request refused by the client before sending it (a key, pool name, TTL or
// option the service would refuse). It matches ErrInvalidInput.
type InputError struct {
	What, Value, Rule string
}

func (e *InputError) Error() string {
	return fmt.Sprintf("idalloc: %s %q is not allowed: %s", e.What, e.Value, e.Rule)
}

// Is matches ErrInvalidInput.
func (e *InputError) Is(target error) bool { return target == ErrInvalidInput }

// redact removes every occurrence of secret from s (a transport error's text may quote the URL).
func redact(s, secret string) string {
	if secret == "" {
		return s
	}
	return strings.ReplaceAll(s, secret, "<session>")
}
