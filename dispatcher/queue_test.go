package dispatcher

import "testing"

func TestQueueOrder(t *testing.T) {
	q := &modelQueue{}
	in := []struct {
		id  string
		pri int
	}{{"a", 0}, {"b", 5}, {"c", -1}, {"d", 0}, {"e", 5}}
	items := map[string]*queued{}
	for i, x := range in {
		e := &queued{id: x.id, priority: x.pri, seq: uint64(i)}
		items[x.id] = e
		q.push(e)
	}
	q.remove(items["d"])
	var got string
	for q.Len() > 0 {
		got += q.pop().id
	}
	if got != "cabe" {
		t.Fatalf("order %q, want cabe (priority, then FIFO; d removed)", got)
	}
}
