package sim

import "strings"

// wordList holds common English words; every one of them, written with a
// leading space, is a single cl100k_base token (words_test.go checks it), so
// generated text tokenizes back to exactly the number of tokens generated.
const wordList = `
the be to of and a in that have it for not on with he as you do at this but his by from they we say her she or
an will my one all would there their what so up out if about who get which go me when make can like time no
just him know take people into year your good some could them see other than then now look only come its over
think also back after use two how our work first well way even new want because any these give day most us is
was are been has had were said did made find where long down may part being world life still hand high place
small large next early young important few public same able house system group number water room mother area
money story fact month lot right study book eye job word business issue side kind head far black white little
own old great big city home point state school family student country problem program question during
government company night light river mountain forest garden window table paper music voice color green blue red
open close build learn read write speak listen follow begin keep start show hear play run move live believe
hold bring happen provide sit stand lose pay meet include continue set change lead understand watch stop create
allow add spend grow offer remember love consider appear buy wait serve die send expect stay fall cut reach
kill remain suggest raise pass sell require report decide pull simple quiet bright warm cold soft strong clear
deep happy short ready sure true whole real best better free full special easy hard late human local major
possible social national sea sky sun moon star tree stone road bridge field village market street station
letter dream idea plan reason result moment answer morning evening summer winter spring autumn friend child
teacher doctor king queen ship train car horse bird fish dog cat food bread apple coffee tea fire wind rain
snow cloud ocean island valley`

// starterList opens a sentence; each is one token both with and without a
// leading space.
const starterList = `The In It This We A There They When After Our Every Some Many`

var (
	words         []string // " word"
	starters      []string // "The": the first token of a chat answer
	spaceStarters []string // " The": after a full stop
)

func init() {
	for _, w := range strings.Fields(wordList) {
		words = append(words, " "+w)
	}
	for _, w := range strings.Fields(starterList) {
		starters = append(starters, w)
		spaceStarters = append(spaceStarters, " "+w)
	}
}
