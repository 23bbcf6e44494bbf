"""Data for the generated "task" training prompts (no logic): request skeletons per kind, and the slot tables.

A skeleton's `{slot}` is filled from WORDS (an entry may hold slots itself), NUMBERS (an inclusive range),
RECORDS (3-4 filled record sentences, a passage to extract from) or a generator in prompts.py. A digit
suffix (`{name2}`) draws another, distinct value of the same slot. All text is written here; none is taken
from the held-out MT-Bench or HumanEval sets.
"""

TASKS: dict[str, tuple[str, ...]] = {
    "extraction": (
        "Extract each person's name, age, job and city from the text below. Return a JSON list of objects "
        "with the keys name, age, job and city.\n\n{people}",
        "Read these notes and make a Markdown table with the columns Name, Age and City, sorted by age.\n\n{people}",
        "Summarize the following records in two sentences, then state the average age of the people "
        "mentioned.\n\n{people}",
        "From the text below, list every company with its revenue and year, one per line in the form "
        "company | revenue | year.\n\n{companies}",
        "Which of the companies described below had the largest revenue? Answer in one sentence, then give "
        "all of them as JSON with the keys company and revenue_millions.\n\n{companies}",
        "Here are some product reviews. For each product give its name, its price and the main complaint, "
        "as CSV with a header row.\n\n{reviews}",
        "Label each review below as positive, negative or mixed, with a one-line reason for each label."
        "\n\n{reviews}",
        "Turn this announcement into a chronological list of events with the day, time, place and host of "
        "each.\n\n{schedule}",
        "Pull every event out of the message below into a JSON object that maps the event name to its day, "
        "time and room.\n\n{schedule}",
    ),
    "math": (
        "A {item} costs ${price}. It is on sale for {pct}% off, and sales tax of {tax}% is added to the sale "
        "price. What is the final price? Show your steps.",
        "{name} can {chore} in {hours} hours, and {name2} can do the same job in {hours2} hours. How long "
        "will it take if they work together? Show your steps.",
        "The ages of {name} and {name2} add up to {age_sum}, and {name} is {age_diff} years older than "
        "{name2}. How old is each of them? Explain your reasoning step by step.",
        "A rectangular garden is {side} m long and {side2} m wide. A path {width} m wide runs around the "
        "outside of the garden. Find the area of the path and show your work.",
        "A {ladder} m ladder leans against a wall with its foot {foot} m from the wall. How high up the wall "
        "does it reach? Show your steps and round to two decimal places.",
        "A bag holds {marbles} red, {marbles2} blue and {marbles3} green marbles. Two marbles are drawn "
        "without replacement. What is the probability that both are the same color? Show your steps.",
        "What are the next two numbers in the sequence {sequence}? Explain the rule you found.",
        "{name} puts ${deposit} into a savings account that pays {rate}% interest per year, compounded "
        "yearly. How much will the account hold after {years} years? Show the balance after each year.",
        "How many liters of a {low_pct}% salt solution must be mixed with {liters} liters of a {high_pct}% "
        "salt solution to make a {mid_pct}% solution? Set up an equation and solve it step by step.",
        "{name} drives {dist} km at {speed} km/h and then {dist2} km at {speed2} km/h. What is the average "
        "speed for the whole trip? Show your steps.",
        "{name}'s test scores so far are {scores}. What score is needed on the next test to bring the "
        "average up to {target_score}? Is that possible if the maximum score is 100? Explain.",
        "A recipe for {servings} people uses {grams} g of flour and {ml} ml of milk. How much of each is "
        "needed for {servings_big} people? Show your steps.",
        "A circular pond has a radius of {radius} m. A fence is put up {width} m outside its edge all the "
        "way around. How long is the fence, and what area does it enclose? Use 3.14 for pi and show your work.",
        "A spinner has {count} equal sections numbered 1 to {count}. If it is spun twice, what is the "
        "probability that the two numbers add up to an even number? Explain step by step.",
        "The population of {town} was {big} in {year}. If it grows by {rate}% every year, what will it be "
        "{years} years later? Show the value for each year.",
    ),
    "reasoning": (
        "Solve this puzzle and explain your reasoning step by step.\n\n{order_puzzle}",
        "{order_puzzle} Walk me through how you know.",
        "Here is a logic puzzle:\n\n{assignment_puzzle}\n\nExplain each deduction you make.",
        "{name}, {name2} and {name3} need a one-hour meeting this week. {name} is free {free}, {name2} is "
        "free {free2}, and {name3} is free {free3}. When can all three meet? If there is no such time, say "
        "what is the smallest change that would make one possible.",
        "I left a {frozen_item} on the kitchen counter of a warm room for {hours} hours. What state is it "
        "most likely in now, and why?",
        "If today is {day}, what day of the week will it be in {days_ahead} days? Explain how you worked it out.",
        "A clock shows {clock_hour}:{clock_minute}. What is the angle between the hour hand and the minute "
        "hand? Explain step by step.",
        "Is the following argument valid? \"{syllogism}\" Explain why or why not.",
        "There are {count} people at a meeting and each of them shakes hands with every other person exactly "
        "once. How many handshakes take place? Explain your reasoning.",
        "{name} says: \"{everyday_claim}\" Is this a sound conclusion? Point out any hidden assumptions.",
    ),
    "roleplay": (
        "Pretend you are {persona}. {persona_question}",
        "Act as {consultant}",
        "I want you to act as {consultant} Keep your answer practical and brief.",
        "You are {persona}. A visitor asks you: \"{visitor_question}\" Answer in character, in a few paragraphs.",
        "Stay in character as {persona}. Introduce yourself, then describe {scene}.",
        "Imagine you are {persona} writing a diary entry at the end of a long day. Write the entry.",
        "Play the role of {persona} and give a short speech to {audience} about {speech_topic}.",
        "From now on, speak as {persona}. Explain {stem} the way you would explain it to a friend.",
    ),
    "writing": (
        "Write about {subject} in exactly {n_sent} sentences.",
        "Describe {subject} in fewer than {n_words} words.",
        "Give {n_items} tips for {activity} as a bullet list. Keep each bullet under {n_short} words.",
        "Write a short description of {subject} as a JSON object with the keys \"title\", \"mood\" and "
        "\"summary\".",
        "Write a paragraph about {subject} in which every sentence starts with the letter {letter}.",
        "Write a formal letter to {recipient} about {letter_subject}.",
        "Write a limerick about {limerick_subject}.",
        "Write an acrostic poem on the word {acrostic}, one line per letter, about {subject}.",
        "Write a story of under {n_words} words about {character} who {story_event}. End it with a surprise.",
        "Write a social media post of at most 280 characters announcing {announcement}.",
        "Write a short product announcement for the {brand} {gadget}: a headline, then exactly {n_items} "
        "bullet points.",
        "Write two opening lines for a story about {character}: one funny and one serious.",
    ),
    "editing": (
        "Fix the grammar and spelling in this sentence: \"{flawed}\"",
        "Correct the mistakes in the text below and list every change you made.\n\n{flawed} {flawed2}",
        "Rewrite this message so that it sounds formal and professional:\n\n\"{casual}\"",
        "Rewrite this sentence in simple English that a ten-year-old would understand: \"{officialese}\"",
        "Shorten this passage to a single sentence that keeps its main point:\n\n{passage}",
        "Make this message more polite without changing what it asks for:\n\n\"{blunt}\"",
        "Rewrite the following paragraph in the present tense:\n\n{passage}",
        "Turn these notes into one well-written paragraph:\n\n{notes}",
        "Rewrite this sentence in the passive voice, then say which version reads better: \"{active}\"",
    ),
    "stem": (
        "Explain {stem} to {learner}, then give an everyday example.",
        "Compare {stem_pair}. Summarize the main differences in a short table.",
        "What is {stem}? Explain it first to {learner}, then in one precise technical sentence.",
        "Describe a simple experiment {setting} that demonstrates {stem_demo}, and say what result you would "
        "expect.",
        "Why does {stem} matter? Give two places where it shows up in real life and explain one in detail.",
        "Explain {stem}. Then write {n_items} quiz questions about it and answer them.",
        "What are the most common misunderstandings about {stem}? Correct each one briefly.",
        "Explain {stem} using an analogy from {analogy_domain}, then say where the analogy breaks down.",
        "Explain the difference between {stem_pair}, then give one example of each.",
        "Explain {stem} in {n_sent} sentences for {learner}, then list {n_items} key terms with a one-line "
        "definition each.",
    ),
    "humanities": (
        "What were the main causes and consequences of {history_event}? End with one lesson it offers today.",
        "Compare {humanities_pair}. What do they have in common, and where do they differ most?",
        "Explain {humanities} to {learner} and then give an example from everyday life.",
        "Summarize the key ideas of {humanities} in {n_items} bullet points, then explain which one is most "
        "often misunderstood.",
        "How did {history_event} change daily life for ordinary people? Give concrete examples.",
        "Give one argument for and one against this claim, then your own view: \"{claim}\"",
        "Explain {humanities} to someone who has never studied it, then suggest a question for a class "
        "discussion.",
        "What can {history_event} teach us about {modern_issue}? Compare then and now.",
        "Write a short dialogue in which {expert} and {expert2} discuss {humanities}.",
        "What role did {history_event} play in shaping {aspect}? Give two examples.",
    ),
}

# Inclusive ranges of the number slots.
NUMBERS: dict[str, tuple[int, int]] = {
    "age": (19, 68), "price": (12, 480), "pct": (5, 40), "tax": (3, 12), "hours": (2, 9), "speed": (30, 110),
    "count": (4, 12), "big": (1200, 98000), "year": (2012, 2024), "revenue": (4, 950), "stars": (1, 5),
    "side": (4, 30), "width": (1, 4), "radius": (2, 15), "ladder": (7, 14), "foot": (2, 5), "marbles": (2, 9),
    "deposit": (200, 5000), "rate": (2, 8), "years": (2, 5), "low_pct": (5, 15), "high_pct": (35, 60),
    "mid_pct": (18, 30), "liters": (2, 12), "dist": (40, 300), "target_score": (75, 92), "servings": (2, 6),
    "servings_big": (8, 24), "grams": (150, 900), "ml": (100, 750), "age_sum": (30, 90), "age_diff": (2, 24),
    "days_ahead": (10, 400), "clock_hour": (1, 12), "n_sent": (3, 7), "n_words": (40, 120),
    "n_short": (6, 12), "n_items": (3, 7), "room": (101, 420), "waitlist": (20, 150),
}

# Record sentences: a {people}, {companies}, ... slot becomes 3-4 of them, filled with distinct values.
RECORDS: dict[str, tuple[str, ...]] = {
    "people": (
        "{name} is {age} years old and works as {profession} in {town}.",
        "{name}, aged {age}, moved to {town} in {year} and now works as {profession}.",
        "At {age}, {name} is {profession} living in {town}.",
    ),
    "companies": (
        "{company}, based in {town}, reported revenue of ${revenue} million in {year}, {trend} on the year before.",
        "In {year}, {company} earned ${revenue} million, {trend}; its chief executive is {name}.",
        "Revenue at {company} reached ${revenue} million in {year} under its founder {name}.",
    ),
    "reviews": (
        "The {brand} {gadget} costs ${price}. Reviewers praise its {praise} but complain about its {flaw}.",
        "I paid ${price} for the {brand} {gadget}. I love the {praise}, but the {flaw} is a real letdown. "
        "{stars} stars.",
        "The {brand} {gadget} (${price}) gets {stars} out of 5 from most buyers, who mention its {praise}.",
    ),
    "schedule": (
        "On {day} at {time}, {name} will lead {event} in room {room}.",
        "{name} hosts {event} on {day} at {time} in room {room}.",
        "Please note that {event} moves to {day} at {time}, room {room}; {name} is in charge.",
    ),
}

WORDS: dict[str, tuple[str, ...]] = {
    "name": ("Amara", "Ben", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Keiko",
             "Liam", "Maya", "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Samir", "Tessa", "Umar", "Vera",
             "Wes", "Ximena", "Yusuf", "Zoe", "Anika", "Bruno", "Carmen", "Diego", "Esther", "Felix"),
    "town": ("Brindlemoor", "Castavel", "Dunmere", "Eastwick Falls", "Fenwood", "Galloway Point", "Hollins Creek",
             "Ivybridge", "Juniper Flats", "Kestrel Bay", "Larchmont Hill", "Millbrook", "Northgate",
             "Oakhaven", "Port Sable", "Ravensworth", "Stonebury", "Thornfield", "Willow Ford"),
    "company": ("Northwind Textiles", "Bluepeak Robotics", "Copperleaf Foods", "Silverline Logistics",
                "Greenhollow Energy", "Quarry Lane Books", "Redfern Optics", "Tidewater Shipping",
                "Lumen Harbor Software", "Oakridge Ceramics", "Pinecrest Bikes", "Starling Audio"),
    "profession": ("a nurse", "an electrician", "a librarian", "a baker", "a civil engineer", "a pharmacist",
                   "a carpenter", "a data analyst", "a journalist", "a veterinarian", "a pilot", "a chef",
                   "an architect", "a florist", "a mechanic", "a translator", "a bus driver", "a dentist"),
    "trend": ("up {pct}%", "down {pct}%", "roughly flat"),
    "brand": ("Zentra", "Kolby", "Aurelio", "Maplewise", "Novabright", "Trekmark", "Humbird", "Quillon",
              "Brightnest", "Solvo"),
    "gadget": ("espresso machine", "e-reader", "air purifier", "electric scooter", "blender", "desk lamp",
               "rice cooker", "pair of headphones", "fitness tracker", "camping stove", "keyboard", "projector"),
    # Praise and complaints that fit any product and never contradict each other.
    "praise": ("build quality", "sleek design", "easy setup", "light weight", "long warranty", "low price",
               "simple controls", "solid feel"),
    "flaw": ("confusing instructions", "flimsy packaging", "slow delivery", "poor customer support",
             "stiff buttons", "bland color choices", "bulky box"),
    "day": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "time": ("8:30", "9:00", "9:45", "10:15", "11:00", "12:30", "13:00", "14:15", "15:30", "16:00", "17:45"),
    "am_time": ("6:00", "7:30", "8:00", "9:00", "10:00"),
    "pm_time": ("13:00", "14:30", "16:00", "17:00", "18:30"),
    "event": ("the budget review", "a product demo", "the volunteer briefing", "a team lunch",
              "the design workshop", "a client call", "the safety training", "the planning session",
              "a guest lecture", "the charity bake sale", "the onboarding session"),
    "item": ("jacket", "bicycle", "coffee table", "pair of boots", "tablet", "tent", "guitar", "printer",
             "sofa", "backpack"),
    "chore": ("paint a garden fence", "sort a box of mail", "assemble a bookshelf", "clean a swimming pool",
              "mow a sports field", "wash all the windows of a house", "pack a moving van"),
    "free": ("on {day} from 9:00 to 12:00", "on {day} afternoon after 14:00", "every morning before 11:00",
             "on {day} and {day2} between 13:00 and 16:00", "only on {day} from 10:00 to 11:30",
             "any afternoon except {day}"),
    "frozen_item": ("tub of ice cream", "bag of frozen peas", "tray of ice cubes", "frozen pizza",
                    "block of frozen butter"),
    "clock_minute": ("00", "10", "15", "20", "30", "40", "45", "50"),
    "plural": ("gardeners", "musicians", "early risers", "tea drinkers", "cyclists", "chess players",
               "painters", "swimmers", "teachers", "bakers"),
    "syllogism": ("All {plural} are {plural2}. Some {plural2} are {plural3}. Therefore some {plural} are {plural3}.",
                  "No {plural} are {plural2}. All {plural3} are {plural}. Therefore no {plural3} are {plural2}.",
                  "All {plural} are {plural2}. {name} is one of the {plural2}. Therefore {name} is one of the "
                  "{plural}.",
                  "If {name} is among the {plural}, then {name} gets up early. {name} gets up early. "
                  "Therefore {name} is among the {plural}."),
    "everyday_claim": ("The bakery on my street always has a queue, so its bread must be the best in town.",
                       "I wore my blue socks and we won the match, so I should wear them every time.",
                       "Everyone in my office drinks coffee, so coffee must make people productive.",
                       "The last two buses were late, so the next one will be late too.",
                       "This phone is the most expensive one in the shop, so it must last the longest."),
    "persona": ("a lighthouse keeper on a remote island", "a medieval blacksmith", "a ship's navigator in the 1700s",
                "a retired astronaut", "a detective in 1920s Chicago",
                "a barista who has seen every kind of customer", "a wizard who is hopeless with technology",
                "a friendly dragon who guards a library", "a Roman centurion", "a deep-sea diver",
                "a time traveler from the year 2300", "a grumpy old cat", "a park ranger in a national forest",
                "a street food vendor", "a mountain guide in the Andes", "a jazz pianist in a late-night club",
                "a robot learning human manners", "a museum curator", "a pirate captain who retired to a farm",
                "a stage magician", "a beekeeper", "a news anchor in the year 3000"),
    "persona_question": ("What does a typical morning look like for you?",
                         "What is the hardest part of your work, and how do you deal with it?",
                         "What advice would you give someone who wants to follow in your footsteps?",
                         "Describe the most memorable day you have had.",
                         "What tool or possession could you not live without, and why?",
                         "What do people usually get wrong about you?",
                         "How has your world changed since you were young?"),
    "consultant": ("a career counselor and answer this: I have worked in retail for {years} years and want to "
                   "move into {field}. Where should I start?",
                   "a personal fitness coach and answer this: I can only exercise for twenty minutes a day. What "
                   "routine would you suggest?",
                   "a travel planner and answer this: I have {n_items} days and a small budget for a trip to "
                   "{town}. How should I plan it?",
                   "a nutrition advisor and answer this: how can a busy student eat better without spending "
                   "more?",
                   "a garden designer and answer this: my backyard is {side} by {side2} meters and mostly shade. "
                   "What should I plant?",
                   "a financial planner and answer this: I earn ${big} a year. How should I start saving for "
                   "retirement?",
                   "a home repair expert and answer this: my {gadget} stopped working this morning. What should "
                   "I check first?",
                   "a study coach and answer this: I have an exam on {day} and I keep putting off revision. "
                   "What should I do?"),
    "field": ("graphic design", "web development", "nursing", "accounting", "teaching", "marketing",
              "project management"),
    "visitor_question": ("What is the strangest thing you have ever seen here?", "Can you teach me your trade?",
                         "Are you ever lonely?", "What would you change about your life if you could?",
                         "What is the secret to doing your job well?", "How did you end up here?"),
    "scene": ("the view from where you work", "the strangest thing that happened to you this year",
              "your favorite meal and who you share it with", "a normal working day", "the place you call home"),
    "audience": ("a class of schoolchildren", "a group of new apprentices", "a town council meeting",
                 "a crowd at a summer fair", "a group of tourists"),
    "speech_topic": ("why patience matters", "the value of hard work", "taking care of the planet",
                     "learning from mistakes", "the joy of small things"),
    "subject": ("your favorite season", "a rainy afternoon in a big city", "learning to ride a bike",
                "the first day at a new job", "a small bakery that opens at dawn", "a forgotten garden",
                "moving to a new country", "an old wooden boat", "a night market", "a town festival",
                "a quiet library", "a long train journey", "a lost dog finding its way home",
                "the last day of the summer holidays", "a power cut in winter", "a community garden",
                "a family recipe book", "a busy airport at midnight", "a mountain village in the snow"),
    "activity": ("keeping houseplants alive", "studying for exams", "packing for a camping trip",
                 "running a first 5K", "saving money on groceries", "learning to draw",
                 "staying focused while working from home", "making friends in a new city",
                 "writing a cover letter", "caring for a new puppy", "cutting down screen time",
                 "cooking for a large group"),
    "letter": ("A", "B", "C", "D", "F", "G", "H", "L", "M", "P", "R", "S", "T", "W"),
    "recipient": ("your city council", "your landlord", "a university admissions office", "the manager of a hotel",
                  "the editor of a local newspaper", "a school principal", "a software company's support team"),
    "letter_subject": ("a broken streetlight on your road", "a request to extend a deadline",
                       "a delivery that is three weeks late", "a proposal for a community garden",
                       "thanks for excellent service", "a request for a refund",
                       "night-time noise from a building site"),
    "limerick_subject": ("a cat who loves to sail", "a chef who burns everything", "a forgetful robot",
                         "a giraffe at a tea party", "a programmer who never sleeps", "a snail in a hurry",
                         "a penguin lost in the desert", "a dentist afraid of teeth"),
    "acrostic": ("SPRING", "RIVER", "HOPE", "GARDEN", "LIGHT", "OCEAN", "MUSIC", "FRIEND", "WINTER", "BREAD"),
    "character": ("a shy lighthouse keeper", "a retired clockmaker", "a girl who collects maps",
                  "a robot gardener", "an old fisherman", "a young chess prodigy", "a street musician",
                  "a baker who cannot taste"),
    "story_event": ("finds a letter that was never sent", "receives a package with no return address",
                    "loses a key that opens something unexpected", "meets a stranger on the last bus home",
                    "discovers a room that is not on the building plans", "wins a prize they never entered for"),
    "announcement": ("a neighborhood cleanup day", "a free coding workshop for teenagers",
                     "the opening of a new public pool", "a used-book sale at the library", "a charity fun run"),
    "thing": ("printer", "shared calendar", "login page", "coffee machine", "expense form", "parking permit"),
    "project": ("website redesign", "spring catalog", "office move", "client survey", "training plan"),
    "casual": ("hey {name}, the {thing} is totally broken again lol. can u take a look before {day}?? thx",
               "yo team, meeting got moved to {time} cuz the room's taken. bring ur laptops, we gotta sort out "
               "the {project} mess",
               "hi, got ur email. honestly the price is way too high. knock off {pct}% and we've got a deal",
               "sorry cant make it on {day}, kid's sick. can we do next week instead? lmk",
               "so the {project} thing is kinda behind, gonna need a few more days, no biggie right?"),
    "officialese": ("Notwithstanding the aforementioned constraints, the committee has elected to postpone its "
                    "deliberations concerning the {project} until adequate funding has been secured.",
                    "Residents are hereby advised that water service in {town} will be temporarily discontinued "
                    "between {am_time} and {pm_time} to facilitate essential maintenance.",
                    "Failure to furnish the requisite documentation by {day} shall result in the forfeiture of any "
                    "prior entitlement to a refund.",
                    "Owing to unprecedented demand, dispatch of the {gadget} may be subject to delays of "
                    "indeterminate duration.",
                    "Patrons are kindly requested to refrain from the consumption of food and beverages within "
                    "the reading rooms of the {town} library."),
    "blunt": ("Your report was late again. Send it by {day} or don't bother.",
              "I don't have time for this. Figure out the {project} yourself.",
              "The {gadget} you sold me broke after {n_items} days. I want my money back now.",
              "Stop parking in front of my garage, {name}.",
              "Nobody read the agenda. Read it before the meeting on {day}."),
    "passage": ("The town of {town} held its yearly harvest fair last weekend. More than {big} visitors came, "
                "and the pie contest was won by {name}, who had entered every year since {year}. The organizers "
                "said the fair raised enough money to repair the old bandstand.",
                "{name} opened a small repair shop in {town} in {year}. At first only a few neighbors came by, but "
                "word spread quickly. By the end of the first year the shop was fixing about {count} bicycles a "
                "week and had hired {name2} as a second mechanic.",
                "The {town} library started lending tools as well as books. People borrowed drills, ladders and "
                "sewing machines, and the waiting list grew to {waitlist} names within a month. The librarians "
                "said the idea came from {name}, a regular visitor."),
    "notes": ("- meeting with {name} on {day}\n- {project} is {n_items} days behind\n- need two more people\n"
              "- decide on budget by {day2}",
              "- trip to {town}, {n_items} days\n- train cheaper than flying\n- hotel near the old harbor\n"
              "- {name} will book tickets",
              "- new {gadget} arrived broken\n- support said wait {n_items} days\n- still no reply\n"
              "- ask for a refund instead"),
    "active": ("{name} repaired the {gadget} before lunch.", "The committee approved the {project} on {day}.",
               "{name} and {name2} painted the school hall over the weekend.",
               "A storm knocked down three trees in {town} last night."),
    "stem": ("osmosis", "the Doppler effect", "entropy", "natural selection", "the greenhouse effect",
             "the refraction of light", "buoyancy", "enzyme activity", "the carbon cycle", "radioactive half-life",
             "Ohm's law", "the Coriolis effect", "cell division", "catalysis", "the propagation of sound",
             "friction", "binary search", "the law of large numbers", "a vector", "the derivative in calculus",
             "electromagnetic induction", "the nitrogen cycle", "an ocean current", "vaccination",
             "public-key encryption", "compound interest", "the Richter scale", "the refrigeration cycle",
             "the pH scale", "GPS positioning", "a hash function", "the speed of light", "capillary action",
             "the water table", "antibiotic resistance", "a neural network", "the ozone layer",
             "tectonic subduction", "the placebo effect", "standard deviation", "a prime number", "recursion",
             "a black hole's event horizon", "the immune system's memory cells", "a semiconductor"),
    "stem_demo": ("buoyancy", "friction", "the refraction of light", "air pressure", "static electricity",
                  "evaporation", "the conservation of momentum", "how plants move water", "density",
                  "how heat moves through metal"),
    "stem_pair": ("mitosis and meiosis", "weather and climate", "speed and velocity", "viruses and bacteria",
                  "mass and weight", "alternating and direct current", "nuclear fission and nuclear fusion",
                  "the mean and the median", "acids and bases", "conduction and convection",
                  "memory and disk storage", "TCP and UDP", "correlation and causation",
                  "series and parallel circuits"),
    "learner": ("a twelve-year-old", "a high-school student", "my grandmother", "a first-year university student",
                "someone who disliked science at school", "a curious five-year-old"),
    "setting": ("at home", "in a classroom", "with kitchen equipment", "in a school laboratory",
                "for a science fair"),
    "expert": ("a historian", "an economist", "a philosopher", "a curious student", "a journalist",
               "a retired judge", "a novelist"),
    "aspect": ("modern politics", "the way people communicate", "art and literature", "trade", "science",
               "everyday work"),
    "analogy_domain": ("cooking", "football", "city traffic", "gardening", "an orchestra", "a post office"),
    "history_event": ("the fall of the Western Roman Empire", "the invention of the printing press",
                      "the Black Death", "the Protestant Reformation",
                      "the building of the transcontinental railroad", "the abolition of the slave trade",
                      "the women's suffrage movement", "the Meiji Restoration", "the fall of the Berlin Wall",
                      "the spread of the telegraph", "the Dust Bowl", "the decline of the Hanseatic League",
                      "the Columbian exchange", "the rise of the Mongol Empire", "the Irish potato famine",
                      "the invention of the steam engine", "the Universal Declaration of Human Rights",
                      "the founding of the first universities", "the Great Depression"),
    "humanities": ("the social contract", "the separation of powers", "opportunity cost", "cognitive dissonance",
                   "confirmation bias", "the bystander effect", "stream-of-consciousness writing",
                   "the Harlem Renaissance", "the Enlightenment", "the Code of Hammurabi", "the tragic hero",
                   "supply and demand", "the tragedy of the commons", "existentialism",
                   "oral storytelling traditions", "the division of labor", "cultural relativism",
                   "the hero's journey", "the rule of law", "satire"),
    "humanities_pair": ("Athenian democracy and the Roman Republic", "Romanticism and Realism in literature",
                        "utilitarianism and virtue ethics", "Baroque and Classical music",
                        "Impressionism and Cubism", "epic poetry and the modern novel",
                        "the Renaissance and the Enlightenment", "stoicism and epicureanism",
                        "Gothic and Romanesque architecture", "the Greek and Norse myths of creation",
                        "direct and representative democracy", "comedy and tragedy in ancient theater"),
    "claim": ("Cities should ban cars from their centers.", "Homework does more harm than good in primary school.",
              "Every adult should learn a second language.", "Museums should be free to enter.",
              "A four-day working week would benefit most companies.", "Space exploration is worth its cost.",
              "Libraries matter more now than they did fifty years ago.",
              "Schools should teach personal finance.", "Voting should be compulsory.",
              "Translations can never fully capture a poem.", "History should be taught backwards, from today."),
    "modern_issue": ("misinformation online", "public health", "the future of work", "city planning",
                     "climate adaptation", "trust in institutions"),
}

# The ordering puzzle: (relation, question); adjacent facts of a hidden order are stated in random order.
ORDERINGS: tuple[tuple[str, str], ...] = (
    ("is taller than", "Who is the tallest, and who is the shortest?"),
    ("finished the race ahead of", "In what order did they finish?"),
    ("woke up earlier than", "Who woke up last, and who woke up second?"),
    ("lives on a higher floor than", "Who lives on the top floor? List everyone from top to bottom."),
    ("scored more points than", "Rank them from the highest score to the lowest."),
    ("is older than", "Who is the second oldest?"),
)

# The assignment puzzle: (intro, is-fact, is-not-fact, question, items); clues are added until one answer fits.
ASSIGNMENTS: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    ("{people} each own a different pet: {items}.", "{who} owns {what}.", "{who} does not own {what}.",
     "Who owns which pet?", ("a cat", "a dog", "a parrot", "a goldfish", "a rabbit")),
    ("At a cafe, {people} each ordered a different drink: {items}.", "{who} ordered {what}.",
     "{who} did not order {what}.", "Who ordered which drink?", ("tea", "coffee", "juice", "cocoa", "lemonade")),
    ("{people} each booked a different meeting slot: {items}.", "{who} has the {what} slot.",
     "{who} does not have the {what} slot.", "Which slot does each person have?",
     ("9:00", "10:00", "11:00", "14:00", "15:00")),
    ("{people} each have a different job: {items}.", "{who} is {what}.", "{who} is not {what}.",
     "What is each person's job?", ("a teacher", "a pilot", "a baker", "a nurse", "a plumber")),
    ("{people} each live in a different house: {items}.", "{who} lives in {what}.",
     "{who} does not live in {what}.", "Who lives in which house?",
     ("the red house", "the blue house", "the green house", "the white house")),
)

# Grammar and spelling errors to plant in a clean sentence: correct form -> wrong form (whole words).
ERRORS: dict[str, str] = {
    "receive": "recieve", "definitely": "definately", "separate": "seperate", "tomorrow": "tommorow",
    "because": "becuase", "believe": "beleive", "until": "untill", "their": "there", "its": "it's",
    "were": "was", "has": "have", "doesn't": "don't", "than": "then", "beginning": "begining",
    "necessary": "neccessary", "which": "wich", "weather": "whether", "achieve": "acheive", "across": "accross",
    "went": "gone", "really": "realy", "quite": "quiet",
}

# Clean sentences to plant ERRORS in (each holds several of its words).
CLEAN_SENTENCES: tuple[str, ...] = (
    "{name} and {name2} were sure that their team would definitely win the match tomorrow.",
    "The committee has decided to separate the budget into two parts because the beginning of the year is busy.",
    "I believe the new {gadget} works better than its older model, which was really slow.",
    "We went across the bridge even though the weather was getting worse.",
    "{name} doesn't think it is necessary to wait until {day} to receive the results.",
    "The council has promised that the new park will achieve its goals by {year}.",
    "Their neighbors were worried because the river was quite high across the whole valley.",
    "She doesn't believe that the meeting on {day} is really necessary.",
)
