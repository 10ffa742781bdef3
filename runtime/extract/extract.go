// Package extract evaluates the value expressions of the runtime config
// ("$.a.b", "@messageId", "@publishedAt", "@payload", "@header:<Name>") and the
// message id / entity extractors against one delivered message. JSON paths
// are read with gjson straight from the raw payload: nothing is decoded in
// full on the hot path.
package extract

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

var (
	// ErrMissing means the expression names a value the message does not have.
	ErrMissing = errors.New("value missing")
	// ErrInvalidJSON means a JSON path was used on a payload that is not JSON.
	ErrInvalidJSON = errors.New("invalid JSON payload")
	// ErrNotInteger means a value that must be an integer (a sequence) is not.
	ErrNotInteger = errors.New("value is not an integer")
)

// Message is one delivery plus the dedup id extracted from it; expressions
// are evaluated against it. Create it with NewMessage.
type Message struct {
	source.Message
	// ID is the extracted dedup id, empty until the caller sets it.
	ID string

	jsonChecked bool
	jsonValid   bool
	// fields are the top-level members of an object payload, read in one
	// pass on the first top-level lookup: the id, key, sequence and every
	// column then cost no further scan of the payload.
	fields  []field
	indexed bool
}

// field is one top-level member of the payload: its name and raw JSON value,
// both pointing into the payload (32 bytes, against 96 for a gjson.Result:
// the index is the loop's largest allocation per message).
type field struct {
	name, raw string
}

// topLevel returns the payload's top-level member name (the first one when
// a name repeats, as gjson does). The payload must have passed ValidJSON.
func (m *Message) topLevel(name string) gjson.Result {
	if !m.indexed {
		m.indexed = true
		// The fields point into the payload instead of copying it; a
		// delivered payload is never modified.
		m.fields = members(unsafe.String(unsafe.SliceData(m.Body), len(m.Body)), m.fields)
	}
	for i := range m.fields {
		if m.fields[i].name == name {
			return resultOf(m.fields[i].raw)
		}
	}
	return gjson.Result{}
}

// members appends the top-level members of the JSON object s to out (none
// when s is not an object). s must be valid JSON (ValidJSON): the scan only
// finds where each name and value ends, without parsing values (gjson's
// ForEach parses every one, each number into a float64, which cost a fifth
// of the extraction of a typical event).
func members(s string, out []field) []field {
	i := skipSpace(s, 0)
	if i >= len(s) || s[i] != '{' {
		return out
	}
	if out == nil {
		// One allocation for a typical event instead of growing 1, 2,
		// 4, 8 (NewMessages reserves this room for a whole fetch).
		out = make([]field, 0, fieldsPerMessage)
	}
	i++
	for {
		i = skipSpace(s, i)
		if i >= len(s) || s[i] == '}' {
			return out
		}
		if s[i] == ',' {
			i++
			continue
		}
		end, escaped := stringEnd(s, i)
		name := s[i+1 : end-1]
		if escaped {
			name = gjson.Parse(s[i:end]).Str
		}
		i = skipSpace(s, end)
		i = skipSpace(s, i+1) // the ':'
		end = valueEnd(s, i)
		out = append(out, field{name: name, raw: s[i:end]})
		i = end
	}
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index after the closing quote of the string that
// starts at s[i] ('"'), and whether it holds an escape.
func stringEnd(s string, i int) (int, bool) {
	escaped := false
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		}
	}
	return len(s), escaped
}

// valueEnd returns the index after the value that starts at s[i].
func valueEnd(s string, i int) int {
	switch s[i] {
	case '"':
		end, _ := stringEnd(s, i)
		return end
	case '{', '[':
		depth := 0
		for j := i; j < len(s); j++ {
			switch s[j] {
			case '"':
				end, _ := stringEnd(s, j)
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return len(s)
	}
	for j := i; j < len(s); j++ { // a number, true, false or null
		switch s[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return j
		}
	}
	return len(s)
}

// resultOf is the gjson result of one member's raw value with the fields
// extraction reads (Type, Raw, Str), without parsing a number (Num stays 0:
// numbers are read from Raw, exactly).
func resultOf(raw string) gjson.Result {
	switch raw[0] {
	case '"':
		if strings.IndexByte(raw, '\\') < 0 {
			return gjson.Result{Type: gjson.String, Raw: raw, Str: raw[1 : len(raw)-1]}
		}
		return gjson.Parse(raw)
	case '{', '[':
		return gjson.Result{Type: gjson.JSON, Raw: raw}
	case 't':
		return gjson.Result{Type: gjson.True, Raw: raw}
	case 'f':
		return gjson.Result{Type: gjson.False, Raw: raw}
	case 'n':
		return gjson.Result{Type: gjson.Null, Raw: raw}
	}
	return gjson.Result{Type: gjson.Number, Raw: raw}
}

// NewMessage wraps a delivery for evaluation.
func NewMessage(m source.Message) *Message { return &Message{Message: m} }

// fieldsPerMessage is the room NewMessages reserves for each message's
// top-level members: a typical event's, without growing.
const fieldsPerMessage = 8

// NewMessages wraps a fetch's deliveries for evaluation in two allocations
// (the messages and room for their top-level members) instead of one or
// two per message. A message with more members grows its own.
func NewMessages(ms []source.Message) []Message {
	out := make([]Message, len(ms))
	fields := make([]field, 0, len(ms)*fieldsPerMessage)
	for i := range ms {
		out[i].Message = ms[i]
		lo := i * fieldsPerMessage
		out[i].fields = fields[lo : lo : lo+fieldsPerMessage]
	}
	return out
}

// ValidJSON reports whether the payload is JSON; the scan is done once per
// message however many expressions read it.
func (m *Message) ValidJSON() bool {
	if !m.jsonChecked {
		m.jsonValid = gjson.ValidBytes(m.Body)
		m.jsonChecked = true
	}
	return m.jsonValid
}

func (m *Message) header(name string) (string, bool) {
	if v, ok := m.Headers[name]; ok {
		return v, true
	}
	// Brokers differ on header case (NATS and AMQP keep it, HTTP-style
	// gateways canonicalize it), so fall back to a case-insensitive match.
	for k, v := range m.Headers {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}

type exprKind int

const (
	kindJSONPath exprKind = iota
	kindMessageID
	kindPublishedAt
	kindPayload
	kindHeader
)

// Expr is a compiled value expression.
type Expr struct {
	src    string
	kind   exprKind
	path   string // gjson path for kindJSONPath
	top    string // for "$.name": the top-level member read from the index
	header string // header name for kindHeader
}

// Compile checks and compiles a value expression.
func Compile(expr string) (Expr, error) {
	if err := config.ValidateExpression(expr); err != nil {
		return Expr{}, fmt.Errorf("while compiling value expression: %w", err)
	}
	e := Expr{src: expr}
	switch {
	case expr == "@messageId":
		e.kind = kindMessageID
	case expr == "@publishedAt":
		e.kind = kindPublishedAt
	case expr == "@payload":
		e.kind = kindPayload
	case strings.HasPrefix(expr, "@header:"):
		e.kind, e.header = kindHeader, strings.TrimPrefix(expr, "@header:")
	default:
		e.kind, e.path = kindJSONPath, GJSONPath(expr)
		if rest := strings.TrimPrefix(expr, "$."); rest != expr && rest != "" && !strings.Contains(rest, ".") {
			e.top = rest
		}
	}
	return e, nil
}

// MustCompile is Compile for expressions known to be valid (tests, constants).
func MustCompile(expr string) Expr {
	e, err := Compile(expr)
	if err != nil {
		panic(err)
	}
	return e
}

// String returns the source text of the expression.
func (e Expr) String() string { return e.src }

// GJSONPath converts "$.a.b" into a gjson path, escaping every character
// gjson would otherwise read as syntax (wildcards, modifiers, queries), so a
// field literally named "a*" or "@this" is read as a plain key. "$" alone is
// the whole document.
func GJSONPath(expr string) string {
	rest := strings.TrimPrefix(strings.TrimPrefix(expr, "$"), ".")
	if rest == "" {
		return "@this"
	}
	parts := strings.Split(rest, ".")
	for i, p := range parts {
		parts[i] = gjson.Escape(p)
	}
	return strings.Join(parts, ".")
}

// JSON returns the value as a JSON fragment, the form jsonb_populate_recordset
// casts to column types. A JSON null is returned as "null".
func (e Expr) JSON(m *Message) (json.RawMessage, error) {
	switch e.kind {
	case kindMessageID:
		return quote(m.ID), nil
	case kindPublishedAt:
		if m.PublishedAt.IsZero() {
			return nil, fmt.Errorf("%s: %w", e.src, ErrMissing)
		}
		return quote(m.PublishedAt.UTC().Format(time.RFC3339Nano)), nil
	case kindPayload:
		if !m.ValidJSON() {
			return nil, fmt.Errorf("%s: %w", e.src, ErrInvalidJSON)
		}
		return json.RawMessage(m.Body), nil
	case kindHeader:
		v, ok := m.header(e.header)
		if !ok {
			return nil, fmt.Errorf("header %q: %w", e.header, ErrMissing)
		}
		return quote(v), nil
	}
	r, err := e.lookup(m)
	if err != nil {
		return nil, err
	}
	return json.RawMessage(r.Raw), nil
}

// AppendJSON appends the value as JSON (see JSON) to dst without copying a
// payload value first.
func (e Expr) AppendJSON(dst []byte, m *Message) ([]byte, error) {
	if e.kind != kindJSONPath {
		v, err := e.JSON(m)
		return append(dst, v...), err
	}
	r, err := e.lookup(m)
	if err != nil {
		return dst, err
	}
	return append(dst, r.Raw...), nil
}

// Param returns the value for a bound statement parameter: text that
// PostgreSQL parses into the parameter's type, or nil for a JSON null.
// Objects and arrays are passed as their JSON text.
func (e Expr) Param(m *Message) (any, error) {
	switch e.kind {
	case kindJSONPath:
		r, err := e.lookup(m)
		if err != nil {
			return nil, err
		}
		if r.Type == gjson.Null {
			return nil, nil
		}
		if r.Type == gjson.String {
			return r.Str, nil
		}
		// Numbers keep their exact text: PostgreSQL parses it into numeric
		// without the float64 rounding a canonical form could introduce.
		return r.Raw, nil
	case kindPayload:
		if !m.ValidJSON() {
			return nil, fmt.Errorf("%s: %w", e.src, ErrInvalidJSON)
		}
		return string(m.Body), nil
	}
	raw, err := e.JSON(m)
	if err != nil {
		return nil, err
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("while decoding %s: %w", e.src, err)
	}
	return s, nil
}

// Text returns the value as text: a string without quotes, a number in its
// canonical form ("1e3" and "1000.0" are both "1000"). A JSON null or an
// absent value is ErrMissing: an id or key must exist.
func (e Expr) Text(m *Message) (string, error) {
	if e.kind == kindJSONPath {
		r, err := e.lookup(m)
		if err != nil {
			return "", err
		}
		if r.Type == gjson.Null {
			return "", fmt.Errorf("%s is null: %w", e.src, ErrMissing)
		}
		return resultText(r), nil
	}
	v, err := e.Param(m)
	if err != nil {
		return "", err
	}
	return v.(string), nil
}

// Int returns the value as an integer: a JSON integer, or a string holding one
// (headers are always strings).
func (e Expr) Int(m *Message) (int64, error) {
	s, err := e.Text(m)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s = %q: %w", e.src, truncate(s, 40), ErrNotInteger)
	}
	return n, nil
}

func (e Expr) lookup(m *Message) (gjson.Result, error) {
	if !m.ValidJSON() {
		return gjson.Result{}, fmt.Errorf("%s: %w", e.src, ErrInvalidJSON)
	}
	var r gjson.Result
	if e.top != "" {
		r = m.topLevel(e.top)
	} else {
		r = gjson.GetBytes(m.Body, e.path)
	}
	if !r.Exists() {
		return gjson.Result{}, fmt.Errorf("%s: %w", e.src, ErrMissing)
	}
	return r, nil
}

func resultText(r gjson.Result) string {
	switch r.Type {
	case gjson.String:
		return r.Str
	case gjson.Number:
		return CanonicalNumber(r.Raw)
	}
	return r.Raw
}

// CanonicalNumber renders a JSON number so that equal values give equal text:
// integers exactly (any size, no exponent, "-0" is "0"), other values as the
// shortest decimal that round-trips through float64.
func CanonicalNumber(raw string) string {
	if plainInteger(raw) {
		return raw
	}
	r, ok := new(big.Rat).SetString(raw)
	if !ok {
		return raw
	}
	if r.IsInt() {
		return r.Num().String()
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// plainInteger: digits with an optional minus sign and no leading zero,
// already canonical ("-0" is not: it is "0").
func plainInteger(raw string) bool {
	digits := strings.TrimPrefix(raw, "-")
	if digits == "" || (digits[0] == '0' && (len(digits) > 1 || digits != raw)) {
		return false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return false
		}
	}
	return true
}

func quote(s string) json.RawMessage {
	b, _ := json.Marshal(s) // marshalling a string cannot fail
	return b
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Extractor reads the message id, entity key or sequence (config.Extractor).
type Extractor struct {
	expr         Expr
	brokerNative bool
}

// CompileExtractor compiles a config extractor: a header, a JSON path, or the
// broker's native id.
func CompileExtractor(x config.Extractor) (Extractor, error) {
	switch {
	case x.BrokerNative:
		return Extractor{brokerNative: true}, nil
	case x.Header != "":
		return Extractor{expr: Expr{src: "@header:" + x.Header, kind: kindHeader, header: x.Header}}, nil
	case x.JSONPath != "":
		e, err := Compile(x.JSONPath)
		if err != nil {
			return Extractor{}, err
		}
		if e.kind != kindJSONPath {
			return Extractor{}, fmt.Errorf("while compiling extractor: %q is not a JSON path", x.JSONPath)
		}
		return Extractor{expr: e}, nil
	}
	return Extractor{}, errors.New("while compiling extractor: none of header, jsonPath, brokerNative is set")
}

// Text returns the extracted value as text; empty is ErrMissing.
func (x Extractor) Text(m *Message) (string, error) {
	if x.brokerNative {
		if m.NativeID == "" {
			return "", fmt.Errorf("broker native id: %w", ErrMissing)
		}
		return m.NativeID, nil
	}
	s, err := x.expr.Text(m)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", fmt.Errorf("%s is empty: %w", x.expr.src, ErrMissing)
	}
	return s, nil
}

// Int returns the extracted value as an integer (entity sequence).
func (x Extractor) Int(m *Message) (int64, error) {
	if x.brokerNative {
		return 0, errors.New("broker native id is not a sequence")
	}
	return x.expr.Int(m)
}
