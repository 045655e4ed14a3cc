"""A small FAQ workload for the semantic cache benchmark (written for this project).

``FAQ``: 40 support questions, each with paraphrases that should be answered the same way.
``DISTRACTORS``: questions that share words with an FAQ entry but ask something else; a
semantic hit on one of them is a false hit (the wrong answer served).
"""

from __future__ import annotations

FAQ: tuple[tuple[str, ...], ...] = (
    (
        "How do I reset my password?",
        "I forgot my password, how can I reset it?",
        "What's the way to change a password I can't remember?",
    ),
    (
        "How can I cancel my subscription?",
        "I want to cancel my plan, how do I do that?",
        "Where do I go to stop my subscription?",
    ),
    (
        "What payment methods do you accept?",
        "Which ways can I pay?",
        "Can I pay with a credit card or PayPal?",
    ),
    (
        "How long does shipping take?",
        "When will my order arrive?",
        "What is the usual delivery time?",
    ),
    (
        "Do you ship internationally?",
        "Can you deliver to other countries?",
        "Is shipping abroad available?",
    ),
    (
        "How do I return an item?",
        "What is the process for sending a product back?",
        "I want to return something I bought, how?",
    ),
    ("What is your refund policy?", "Can I get my money back?", "How do refunds work?"),
    (
        "How do I track my order?",
        "Where can I see the status of my package?",
        "Is there a tracking number for my delivery?",
    ),
    (
        "How do I change my email address?",
        "Can I update the email on my account?",
        "I need to use a different email for my account.",
    ),
    (
        "How do I delete my account?",
        "I want to close my account permanently.",
        "What are the steps to remove my account?",
    ),
    (
        "Is there a free trial?",
        "Can I try the product for free first?",
        "Do you offer a trial period?",
    ),
    (
        "How do I contact customer support?",
        "How can I reach your support team?",
        "What's the best way to talk to someone from support?",
    ),
    (
        "What are your business hours?",
        "When is your support team available?",
        "At what times can I call you?",
    ),
    (
        "How do I upgrade my plan?",
        "I want to move to a higher tier, how?",
        "How can I switch to the premium plan?",
    ),
    (
        "Can I change my shipping address after ordering?",
        "Is it possible to edit the delivery address on an order I already placed?",
        "I entered the wrong address, can I fix it after checkout?",
    ),
    (
        "How do I apply a discount code?",
        "Where do I enter a promo code?",
        "How can I use a coupon at checkout?",
    ),
    (
        "Do you offer student discounts?",
        "Is there a discount for students?",
        "Can students get a reduced price?",
    ),
    (
        "How do I enable two-factor authentication?",
        "How can I turn on 2FA for my account?",
        "Where do I set up two-step verification?",
    ),
    (
        "Why was my payment declined?",
        "My card was rejected, why?",
        "What causes a payment to fail?",
    ),
    (
        "How do I download my invoice?",
        "Where can I get a receipt for my purchase?",
        "How do I get a copy of my bill?",
    ),
    (
        "Can I share my account with family members?",
        "Is family sharing allowed on one account?",
        "Can my family use my subscription?",
    ),
    (
        "How do I update my billing information?",
        "How can I change the card you charge?",
        "Where do I edit my payment details?",
    ),
    (
        "What happens when my subscription expires?",
        "What if I don't renew my plan?",
        "What do I lose when my subscription ends?",
    ),
    (
        "Is my personal data secure?",
        "How do you protect my information?",
        "Do you keep my data safe?",
    ),
    (
        "How do I export my data?",
        "Can I download all my data?",
        "Is there a way to get a copy of everything in my account?",
    ),
    (
        "Which browsers are supported?",
        "Does the site work in Firefox and Safari?",
        "What web browsers can I use?",
    ),
    (
        "Is there a mobile app?",
        "Can I use the service on my phone?",
        "Do you have an app for iOS or Android?",
    ),
    (
        "How do I change the language of the interface?",
        "Can I switch the app to Spanish?",
        "Where is the language setting?",
    ),
    (
        "How do I report a bug?",
        "I found a problem in the app, where do I report it?",
        "How can I tell you about an error I encountered?",
    ),
    (
        "Do you have an API?",
        "Can I access the service programmatically?",
        "Is there a developer API available?",
    ),
    (
        "How do I get an API key?",
        "Where can I generate an API token?",
        "How do I create credentials for the API?",
    ),
    (
        "What are the API rate limits?",
        "How many API requests can I make per minute?",
        "Is there a cap on API calls?",
    ),
    (
        "How do I invite a teammate?",
        "How can I add a colleague to my workspace?",
        "Can I add another user to my team?",
    ),
    (
        "How do I remove a team member?",
        "How can I take someone out of my workspace?",
        "I need to revoke a colleague's access, how?",
    ),
    (
        "Can I pause my subscription?",
        "Is it possible to put my plan on hold?",
        "Can I temporarily suspend my membership?",
    ),
    (
        "Do you offer gift cards?",
        "Can I buy a gift card?",
        "Is it possible to give your service as a present?",
    ),
    (
        "How do I unsubscribe from marketing emails?",
        "How can I stop getting promotional emails?",
        "I get too many newsletters, how do I opt out?",
    ),
    (
        "Where are you located?",
        "Where is your company based?",
        "What country is your headquarters in?",
    ),
    (
        "Is there a warranty on products?",
        "Do your products come with a guarantee?",
        "How long is the warranty period?",
    ),
    (
        "How do I change my username?",
        "Can I pick a different user name?",
        "Is it possible to rename my account handle?",
    ),
)

DISTRACTORS: tuple[str, ...] = (
    "How do I reset my router?",
    "How do I cancel an order that already shipped?",
    "What payment methods do you use to pay your suppliers?",
    "How long does a refund take to show on my card?",
    "Do you ship batteries or other hazardous items?",
    "How do I return a gift without the giver knowing?",
    "What is your privacy policy?",
    "How do I track my running workouts in the app?",
    "How do I change my phone number?",
    "How do I delete a single message?",
    "Is there a free version for nonprofits?",
    "How do I contact the sales team about an enterprise deal?",
    "What are your holiday opening days this year?",
    "How do I downgrade my plan?",
    "Can I change the name on my order?",
    "How do I create a discount code for my own store?",
    "Do you hire students for internships?",
    "How do I disable two-factor authentication?",
    "Why was I charged twice?",
    "How do I upload a document?",
    "Can I transfer my account to another person?",
    "How do I update the app?",
    "What happens to my data if you go out of business?",
    "Is my password stored in plain text?",
    "How do I import contacts from a spreadsheet?",
    "Which operating systems are supported by the desktop app?",
    "Does the mobile app work offline?",
    "How do I change the currency shown in prices?",
    "How do I request a new feature?",
    "Do you have a status page?",
    "How do I rotate my API key?",
    "What is the maximum file size I can upload?",
    "How do I make a teammate an administrator?",
    "Can I pause a single delivery?",
    "Can I return a gift card?",
    "How do I subscribe to the newsletter?",
    "Are you hiring?",
    "Is the warranty transferable to a new owner?",
    "How do I change my profile picture?",
    "What is the meaning of life?",
)
