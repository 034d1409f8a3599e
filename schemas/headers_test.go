package schemas

import "testing"

func TestPrefixCachedHeader(t *testing.T) {
	if v := FormatPrefixCached(640, 1000); v != "640/1000" {
		t.Fatalf("FormatPrefixCached = %q", v)
	}
	for _, tc := range []struct {
		v             string
		cached, total int
		ok            bool
	}{
		{"640/1000", 640, 1000, true},
		{"0/7", 0, 7, true},
		{"7/7", 7, 7, true},
		{"8/7", 0, 0, false}, // more cached than there is
		{"0/0", 0, 0, false},
		{"-1/5", 0, 0, false},
		{"5", 0, 0, false},
		{"a/5", 0, 0, false},
		{"", 0, 0, false},
	} {
		c, tot, ok := ParsePrefixCached(tc.v)
		if c != tc.cached || tot != tc.total || ok != tc.ok {
			t.Errorf("ParsePrefixCached(%q) = %d, %d, %v", tc.v, c, tot, ok)
		}
	}
}
