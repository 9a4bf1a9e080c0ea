package jsonview

import "github.com/tidwall/gjson"

// Array returns r if it is a JSON array, else an empty result. gjson's
// ForEach iterates a non-array value once, as itself; the API server's empty
// metadata-only lists say "items": null, which must iterate nothing.
func Array(r gjson.Result) gjson.Result {
	if !r.IsArray() {
		return gjson.Result{}
	}
	return r
}
